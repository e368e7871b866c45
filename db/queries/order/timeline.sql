-- name: RecordTimeline :execrows
-- Records an event in the order's timeline unless it is there already: no
-- row affected means the event was seen before. late is the fate of a reply
-- that found the order terminal, else empty.
INSERT INTO order_timeline (order_id, event_id, event_type, at, reason, late)
VALUES (@order_id, @event_id, @event_type, @at, @reason, @late)
ON CONFLICT (order_id, event_id) DO NOTHING;

-- name: FirstTimelineReason :one
-- The reason of the order's first event of one type, e.g. why stock was
-- refused when the refund that follows it cancels the order.
SELECT reason
FROM order_timeline
WHERE order_id = @order_id AND event_type = @event_type
ORDER BY at, event_id
LIMIT 1;

-- name: RecordTimelines :many
-- Records several events in their orders' timelines with one statement, as
-- RecordTimeline does for one; the arrays are parallel. It returns the rows
-- that were new: an event missing from the result was seen before. Their
-- fates, when late, are decided after (MarkLate).
INSERT INTO order_timeline (order_id, event_id, event_type, at, reason)
SELECT
    unnest(@order_ids::uuid[]),
    unnest(@event_ids::uuid[]),
    unnest(@event_types::text[]),
    unnest(@ats::timestamptz[]),
    unnest(@reasons::text[])
ON CONFLICT (order_id, event_id) DO NOTHING
RETURNING order_id, event_id;

-- name: InsertTimelines :exec
-- Records events the order service emits itself (new ids: nothing to skip)
-- in their orders' timelines; the arrays are parallel.
INSERT INTO order_timeline (order_id, event_id, event_type, at, reason)
SELECT
    unnest(@order_ids::uuid[]),
    unnest(@event_ids::uuid[]),
    unnest(@event_types::text[]),
    unnest(@ats::timestamptz[]),
    unnest(@reasons::text[]);

-- name: ListTimelineReasons :many
-- The reasons of the orders' events of one type, per order in the order
-- FirstTimelineReason reads them: the first row of an order is its answer.
SELECT order_id, event_id, reason
FROM order_timeline
WHERE order_id = ANY (@order_ids::uuid[]) AND event_type = @event_type
ORDER BY order_id, at, event_id;

-- name: MarkLate :exec
-- Records the fates of replies that found their orders terminal: the event
-- event_ids[i] of order order_ids[i] is late[i]. The set-based handler
-- decides them after recording the batch's events. The order ids are named
-- twice, as in SetOrderStatuses: = ANY is an index condition in any plan.
UPDATE order_timeline AS t
SET late = u.late
FROM (SELECT unnest(@order_ids::uuid[]) AS order_id, unnest(@event_ids::uuid[]) AS event_id, unnest(@lates::text[]) AS late) AS u
WHERE t.order_id = u.order_id AND t.event_id = u.event_id AND t.order_id = ANY (@order_ids::uuid[]);

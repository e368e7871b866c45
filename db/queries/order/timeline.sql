-- name: RecordTimeline :execrows
-- Records an event in the order's timeline unless it is there already: no
-- row affected means the event was seen before.
INSERT INTO order_timeline (order_id, event_id, event_type, at, reason)
VALUES (@order_id, @event_id, @event_type, @at, @reason)
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
-- that were new: an event missing from the result was seen before.
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

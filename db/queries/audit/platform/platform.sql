-- Queries of the tables every service database has. The auditor runs them
-- on each of the four databases.

-- name: OutboxStats :one
-- Rows still in the outbox (sent rows are kept for the re-drive window) and
-- those of them not yet published.
SELECT
    (SELECT count(*) FROM outbox)        AS total,
    (SELECT count(*) FROM outbox_unsent) AS unsent;

-- name: ListUnsent :many
-- The oldest unpublished rows, to name them in a violation.
SELECT id, event_id, event_type, subject, created_at
FROM outbox_unsent
ORDER BY id
LIMIT @max_rows;

-- name: CountProcessed :many
-- Inbox rows per consumer (durable). Rows older than the inbox retention
-- have been deleted, so this is a figure, not an invariant.
SELECT consumer, count(*) AS events
FROM processed_events
GROUP BY consumer
ORDER BY consumer;

-- name: MissingProcessed :many
-- The ids among @event_ids for which @consumer has no inbox row: events it
-- acked without committing their effect, unless they are in the DLQ.
SELECT e.event_id::uuid AS event_id
FROM unnest(@event_ids::uuid[]) AS e (event_id)
WHERE NOT EXISTS (
    SELECT 1
    FROM processed_events p
    WHERE p.consumer = @consumer AND p.event_id = e.event_id
);

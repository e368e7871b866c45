-- Read by the operator's console (internal/console) from every service's
-- database.

-- name: OutboxLag :one
-- Unpublished outbox rows and the age of the oldest of them, in seconds
-- (0 when there is none).
SELECT count(*) AS unsent,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_seconds
FROM outbox_unsent;

-- name: ProcessedAt :many
-- When @consumer processed each of @event_ids it has processed.
SELECT event_id, processed_at
FROM processed_events
WHERE consumer = @consumer AND event_id = ANY(@event_ids::uuid[]);

-- name: InsertEvent :exec
INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, traceparent)
VALUES (@event_id, @event_type, @source, @subject, @nats_subject, @event_time, @data, @traceparent);

-- name: TryRelayLock :one
-- One relay at a time publishes a database's outbox, so that events of one
-- aggregate reach the broker in the order they were written. The lock is
-- released with the claiming transaction; another relay takes over at once
-- if this one dies.
SELECT pg_try_advisory_xact_lock(@lock_key::bigint);

-- name: ClaimUnsent :many
SELECT id, event_id, event_type, source, subject, nats_subject, event_time, data, traceparent
FROM outbox
WHERE sent_at IS NULL
ORDER BY id
LIMIT @max_rows
FOR UPDATE SKIP LOCKED;

-- name: MarkSent :exec
-- clock_timestamp(), not now(): now() is when the claiming transaction began,
-- before the publish, and the re-drive window is counted from the ack.
UPDATE outbox SET sent_at = clock_timestamp() WHERE id = ANY(@ids::bigint[]);

-- name: UnsentLag :one
SELECT
    count(*)                                      AS unsent,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM outbox
WHERE sent_at IS NULL;

-- name: DeleteSentOlderThan :execrows
-- Age is measured on the database clock, the clock that wrote sent_at, so
-- that a skewed application clock cannot shorten the re-drive window. The
-- outer condition is re-checked on a row that a concurrent Redrive has just
-- made unsent again, so such a row is kept.
DELETE FROM outbox
WHERE id IN (
    SELECT o.id FROM outbox o
    WHERE o.sent_at < now() - @retention::interval
    ORDER BY o.id
    LIMIT @max_rows
)
AND sent_at < now() - @retention::interval;

-- name: Redrive :execrows
-- Marks rows sent at or after @since as unsent, so the relay publishes them
-- again: harmless, because broker dedup and the consumers' inbox absorb what
-- was already delivered.
UPDATE outbox SET sent_at = NULL WHERE sent_at >= @since::timestamptz;

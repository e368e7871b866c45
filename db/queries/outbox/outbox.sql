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

-- name: InsertEvents :exec
-- Inserts a batch with one statement, in array order: the rows take their
-- ids, and so their publication order, in the order of the arrays.
INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, traceparent)
SELECT e.event_id, e.event_type, e.source, e.subject, e.nats_subject, e.event_time, e.data, e.traceparent
FROM (
    -- Set-returning functions in one select list advance in lockstep.
    SELECT
        unnest(@event_ids::uuid[]) AS event_id,
        unnest(@event_types::text[]) AS event_type,
        unnest(@sources::text[]) AS source,
        unnest(@subjects::text[]) AS subject,
        unnest(@nats_subjects::text[]) AS nats_subject,
        unnest(@event_times::timestamptz[]) AS event_time,
        unnest(@datas::jsonb[]) AS data,
        unnest(@traceparents::text[]) AS traceparent,
        generate_series(1, cardinality(@event_ids::uuid[])) AS ord
) AS e
ORDER BY e.ord;

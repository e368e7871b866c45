-- name: InsertEvent :exec
INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, traceparent)
VALUES (@event_id, @event_type, @source, @subject, @nats_subject, @event_time, @data, @traceparent);

-- name: TryRelayLock :one
-- One relay at a time publishes a database's outbox, so that events of one
-- aggregate reach the broker in the order they were written. A relay holds
-- the lock on its session while it publishes and marks rows sent on that
-- session only, so a relay whose connection dies loses the lock and
-- can mark nothing more; another relay takes over at once. Session and
-- transaction locks on one key exclude each other, so a relay that takes
-- it with pg_try_advisory_xact_lock is kept out as well.
--
-- The session that gets the lock also runs the relay's statements with
-- their generic plans. PostgreSQL would plan ClaimUnsent and MarkSent anew
-- for about every call, their plans for particular arrays looking cheaper
-- than the generic one, and planning them took longer than running them: a
-- sixth of the statement time of a whole deployment at 300 orders/s
-- (pg_stat_statements). Both are index range scans whatever the arguments.
SELECT CASE WHEN pg_try_advisory_lock(@lock_key::bigint)
    THEN set_config('plan_cache_mode', 'force_generic_plan', false) IS NOT NULL
    ELSE false
END AS locked;

-- name: ReleaseRelayLocks :exec
-- Ends a relay's turn on its session: the relay lock and, if the relay
-- sleeps, the sleep lock (the session is a pooled connection's, which holds
-- no other advisory lock), and the generic plans: the session goes back to
-- the pool with the plan_cache_mode it had.
SELECT pg_advisory_unlock_all(), set_config('plan_cache_mode', reset_val, false)
FROM pg_catalog.pg_settings
WHERE name = 'plan_cache_mode';

-- name: ClaimUnsent :many
-- The next batch: the unsent rows in id order from the lowest, leaving out
-- those in flight (published, not yet marked sent), within a window of
-- @batch_size ids; more tells whether unsent rows lie beyond the window.
--
-- The scan starts at the lowest unsent id, not after the last row claimed:
-- a row that commits late with a lower id must still go out before any
-- later event of its aggregate, which was written after it committed and so
-- is seen, in one statement, only together with it.
--
-- Both ends are index probes and the window a range of the partial index,
-- so the cost is that of a batch whatever the backlog and whatever the
-- planner believes of it (stale statistics of a growing outbox make an
-- ORDER BY id LIMIT read and sort every unsent row).
--
-- No row locks: the relay lock keeps other relays out, redrive writes no
-- unsent rows, and the maintenance drops no partition that holds one.
--
-- The outbox is partitioned by created_at (db/migrations/platform/00010);
-- ids are one identity across the partitions, so each end is a probe of
-- every partition's partial index, a handful of partitions.
WITH bounds AS MATERIALIZED (
    SELECT
        first.id AS lo,
        (SELECT min(id) FROM outbox WHERE sent_at IS NULL AND id >= first.id + @batch_size::bigint) IS NOT NULL AS more
    FROM (
        SELECT min(id) AS id FROM outbox
        WHERE sent_at IS NULL AND id NOT IN (SELECT unnest(@in_flight::bigint[]))
    ) AS first
)
SELECT o.id, o.event_id, o.event_type, o.source, o.subject, o.nats_subject, o.event_time, o.data, o.traceparent, bounds.more::boolean AS more
FROM bounds
JOIN outbox o ON o.id >= bounds.lo AND o.id < bounds.lo + @batch_size::bigint
WHERE o.sent_at IS NULL
  AND o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
ORDER BY o.id;

-- name: MarkSent :exec
-- clock_timestamp(), not now(): the re-drive window is counted from the ack.
-- @ids are ascending; the range bounds the scan to the primary key range of
-- the batch, whatever the table's statistics make of the array. Rows in the
-- range but not in @ids (committed after the claim) are left alone.
UPDATE outbox SET sent_at = clock_timestamp()
WHERE id BETWEEN @first_id::bigint AND @last_id::bigint
  AND id = ANY(@ids::bigint[]);

-- name: UnsentLag :one
SELECT
    count(*)                                      AS unsent,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM outbox
WHERE sent_at IS NULL;

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
        unnest(@datas::json[]) AS data,
        unnest(@traceparents::text[]) AS traceparent,
        generate_series(1, cardinality(@event_ids::uuid[])) AS ord
) AS e
ORDER BY e.ord;

-- name: TakeSleepLock :execrows
-- Taken by a relay about to sleep, on the session that holds the relay lock,
-- once no commit in progress holds it shared (see the outbox_notify
-- trigger); while it is held, every commit that inserts rows notifies. One
-- row back means the relay has it; none, that commits are in progress. The
-- claim queued behind it runs either way. (It used to fail instead, which
-- skipped the claim, but pgx prepares every statement of a failed batch
-- again: two more round trips and three plans for a relay that tried to
-- sleep while producers committed, most of its tries at 300 orders/s.)
SELECT 1 WHERE pg_try_advisory_lock(@sleep_key::bigint);

-- name: ReleaseSleepLock :exec
SELECT pg_advisory_unlock(@sleep_key::bigint);

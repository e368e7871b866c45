-- name: InsertEvent :exec
INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, traceparent)
VALUES (@event_id, @event_type, @source, @subject, @nats_subject, @event_time, @data, @traceparent);

-- name: TryRelayLock :one
-- One relay at a time publishes a database's outbox, so that events of one
-- aggregate reach the broker in the order they were written. A relay holds
-- the lock on its session while it publishes and records its batches on
-- that session only, so a relay whose connection dies loses the lock and
-- can record nothing more; another relay takes over at once. Session and
-- transaction locks on one key exclude each other, so a relay that takes
-- it with pg_try_advisory_xact_lock is kept out as well.
--
-- The session that gets the lock runs READ COMMITTED whatever the
-- database's default (the relay's statements each read what committed
-- before them; nothing it does needs more), commits without waiting for
-- the WAL flush (a record a crash loses is one more copy of its rows to
-- publish; see "Positions and their invariants" in internal/outbox), and
-- runs the relay's statements with their generic plans: PostgreSQL would
-- plan Claim anew for about every call, and planning it took longer than
-- running it. Every branch of outbox_unsent_after is an index range or
-- probe whatever the arguments.
--
-- With the lock, it also returns the cluster's identity, recorded with the
-- positions, and why the recorded position is not this cluster's, or ''
-- (outbox_cluster_changed in db/migrations/platform/00013).
SELECT l.locked,
       CASE WHEN l.locked THEN outbox_system_id() ELSE 0 END::bigint AS system_id,
       CASE WHEN l.locked THEN coalesce(outbox_cluster_changed(), '') ELSE '' END::text AS changed
FROM (
    SELECT CASE WHEN pg_try_advisory_lock(@lock_key::bigint)
        THEN set_config('plan_cache_mode', 'force_generic_plan', false) IS NOT NULL
         AND set_config('default_transaction_isolation', 'read committed', false) IS NOT NULL
         AND set_config('synchronous_commit', 'off', false) IS NOT NULL
        ELSE false
    END AS locked
    OFFSET 0
) AS l;

-- name: ReleaseRelayLocks :exec
-- Ends a relay's turn on its session: the relay lock and, if the relay
-- sleeps, the sleep lock (the session is a pooled connection's, which holds
-- no other advisory lock), and the settings TryRelayLock made: the session
-- goes back to the pool as it came.
SELECT pg_advisory_unlock_all(),
       set_config('plan_cache_mode', (SELECT reset_val FROM pg_catalog.pg_settings WHERE name = 'plan_cache_mode'), false),
       set_config('default_transaction_isolation', (SELECT reset_val FROM pg_catalog.pg_settings WHERE name = 'default_transaction_isolation'), false),
       set_config('synchronous_commit', (SELECT reset_val FROM pg_catalog.pg_settings WHERE name = 'synchronous_commit'), false);

-- name: StartOver :one
-- Makes every row kept unsent, on a database whose position is another
-- cluster's (TryRelayLock): the relay publishes them all again.
SELECT outbox_start_over()::bigint AS rows;

-- name: Claim :many
-- The next batch: the batch_size lowest ids of a span's rows that the
-- position does not cover (outbox_covered, db/migrations/platform/00016).
-- The position is the relay's (its last claim's next one, maybe not
-- recorded yet: batches are in flight) unless a redrive came since the
-- relay's claims began (epoch); then it is the recorded one, the redrive's.
--
-- A span is what one snapshot saw, paged in id order. While the position's
-- span has rows left, the batch is its next page: one id range, as the
-- span's rows lie above span_done. Else a new span begins from the
-- position's span: what this statement sees (outbox_unsent_after, whose
-- rows it sees all have ids up to outbox_last_id). A row that commits later
-- has its transaction in the snapshot's running list or above its xmax, so
-- a later span has it. closes tells that the batch is the span's last: once
-- it is acknowledged, (span_snap, span_upto) covers the span (RecordBatch).
-- Per aggregate, id order is write order: an aggregate's next event is
-- written after the commit of its previous one, so a snapshot that sees it
-- sees that one too, and it has a higher id.
WITH pos AS MATERIALIZED (
    SELECT p.epoch,
           CASE WHEN p.epoch = @epoch::bigint THEN CAST(@snap::text AS pg_snapshot) ELSE p.snap END AS snap,
           CASE WHEN p.epoch = @epoch::bigint THEN @upto::bigint ELSE p.upto END AS upto,
           CASE WHEN p.epoch = @epoch::bigint THEN CAST(@span_snap::text AS pg_snapshot) ELSE p.span_snap END AS span_snap,
           CASE WHEN p.epoch = @epoch::bigint THEN @span_upto::bigint ELSE p.span_upto END AS span_upto,
           CASE WHEN p.epoch = @epoch::bigint THEN @span_done::bigint ELSE p.span_done END AS span_done
    FROM outbox_position p
), page AS MATERIALIZED (
    -- The bounds as subqueries, computed once: the index range they make.
    SELECT o.* FROM pos, outbox o
    WHERE (SELECT span_done < span_upto FROM pos)
      AND o.id > (SELECT span_done FROM pos) AND o.id <= (SELECT span_upto FROM pos)
      AND pg_visible_in_snapshot(o.xact_id, pos.span_snap)
      AND NOT outbox_covered(o.id, o.xact_id, pos.snap, pos.upto, pos.span_snap, pos.span_done)
    ORDER BY o.id
    LIMIT @batch_size::bigint
), span AS MATERIALIZED (
    SELECT pos.epoch, pos.snap, pos.upto, pos.span_snap, pos.span_upto, pos.span_done
    FROM pos WHERE EXISTS (SELECT 1 FROM page)
    UNION ALL
    SELECT pos.epoch, pos.span_snap, pos.span_upto, pg_current_snapshot(), greatest(pos.span_upto, outbox_last_id()), 0
    FROM pos WHERE NOT EXISTS (SELECT 1 FROM page)
), batch AS MATERIALIZED (
    SELECT * FROM page
    UNION ALL
    (SELECT o.* FROM span, outbox_unsent_after(span.snap, span.upto, span.span_snap, 0) o
     WHERE NOT EXISTS (SELECT 1 FROM page)
     ORDER BY o.id
     LIMIT @batch_size::bigint)
)
SELECT b.id, b.created_at, b.event_id, b.event_type, b.source, b.subject, b.nats_subject, b.event_time, b.data, b.traceparent,
       span.epoch::bigint AS epoch, span.snap::text AS snap, span.upto::bigint AS upto,
       span.span_snap::text AS span_snap, span.span_upto::bigint AS span_upto,
       ((SELECT count(*) FROM batch) < @batch_size::bigint OR (SELECT max(id) FROM batch) >= span.span_upto)::boolean AS closes
FROM batch b, span
ORDER BY b.id;

-- name: RecordBatch :exec
-- Records a position once every row of the claims up to it was
-- acknowledged: an insert, never an update, so no dead tuple in the
-- outbox. Positions go in claim order, and each covers what the ones
-- before it cover: one that is lost (its statement failed) costs nothing
-- but copies of its rows if the relay stops before the next.
INSERT INTO outbox_batch (snap, upto, span_snap, span_upto, span_done, epoch, system_id)
VALUES (CAST(@snap::text AS pg_snapshot), @upto::bigint, CAST(@span_snap::text AS pg_snapshot), @span_upto::bigint,
        @span_done::bigint, @epoch::bigint, @system_id::bigint);

-- name: UnsentLag :one
SELECT
    count(*)                                      AS unsent,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM outbox_unsent;

-- name: Redrive :one
-- Moves the relay back to its position as of since (outbox_position_before,
-- by the order of the batches, not their clock), so that it publishes again
-- the rows acknowledged since: harmless, because broker dedup and the
-- consumers' inbox absorb what was already delivered. The relay's claims
-- see the new epoch and start from here; marks in flight, computed before,
-- no longer count (the view outbox_position). Reading the outbox takes the lock a
-- partition drop waits for, so no partition goes with rows it makes unsent.
INSERT INTO outbox_redrive (since, snap, upto, span_snap, span_upto, span_done, system_id, rows)
SELECT @since::timestamptz, t.snap, t.upto, t.span_snap, t.span_upto, t.span_done, outbox_system_id(),
       greatest((SELECT count(*) FROM outbox_unsent_after(t.snap, t.upto, t.span_snap, t.span_done))
                - (SELECT count(*) FROM outbox_unsent), 0)
FROM outbox_position_before(@since::timestamptz) t
RETURNING rows;

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
-- once no commit in progress holds it shared (see the outbox_notify trigger,
-- which takes the same key, outbox_sleep_lock_key); while it is held, every
-- commit that inserts rows notifies. One row back means the relay has it;
-- none, that commits are in progress. The claim queued behind it runs either
-- way. (It used to fail instead, which
-- skipped the claim, but pgx prepares every statement of a failed batch
-- again: two more round trips and three plans for a relay that tried to
-- sleep while producers committed, most of its tries at 300 orders/s.)
SELECT 1 WHERE pg_try_advisory_lock(outbox_sleep_lock_key());

-- name: ReleaseSleepLock :exec
SELECT pg_advisory_unlock(outbox_sleep_lock_key());

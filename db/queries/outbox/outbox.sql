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
-- @batch_size ids; more tells whether unsent rows lie beyond the window,
-- and resume_* is the position that the batch's mark records (MarkSent)
-- unless a redrive came after this claim (epoch).
--
-- No row is updated when it is sent: a mark is a row of outbox_sent, so
-- there is no index of unsent rows. The relay finds them from the
-- position its latest mark recorded, read here in the same snapshot as the
-- marks: every row below resume_id whose transaction had finished at the
-- claim that computed it (xact_id below resume_xmax, not among
-- resume_xip) was sent by then. So the unsent rows are among
--   - the rows from resume_id up, a range of the primary key in which only
--     the rows in flight and those sent since are sent, a batch or two;
--   - below it, the rows of transactions that had not finished, found by
--     their xact_id (outbox_xact_idx): those that committed since, a round
--     trip's writes or so, and those of transactions still open, whatever
--     their age, each an index probe, instead of every row written since
--     the oldest of them began.
-- A transaction takes its row's id before it commits, so a row can commit
-- after rows with higher ids were sent: with a transaction id horizon it is
-- found without rechecking a window of ids below the position, which no
-- fixed width would make safe. It is published before later events of its
-- aggregate, which were written after it committed and so are seen, in one
-- statement, together with it: the window starts at the lowest of both.
--
-- The position after this claim (resume_*): the ids below the window's end
-- (and below resume_id) are all sent, claimed or in flight, but for rows
-- that this statement does not see, whose transactions had not finished at
-- its snapshot; its snapshot's xmax and xip become the horizon. When rows
-- of the transactions below the position lie beyond the window (more than a
-- batch of them), the horizon stays, so that the next claim still sees
-- them.
--
-- Redrive deletes marks, positions included, sent since a time; the
-- positions left were recorded before every mark it deleted, so the rows
-- it makes unsent are found. A position computed before a redrive is not
-- recorded after it: the mark compares epoch, the latest redrive at the
-- claim, with the latest at the mark, and a redrive waits for the marks in
-- progress and holds off new ones until it commits (LockMarks). With no position (a new database, one whose
-- marks were all dropped or redriven), the claim starts from the lowest id:
-- a scan of the rows kept that are sent, once.
--
-- Each part is an index range or probe, so the cost is that of a batch
-- whatever the backlog and the table's size, and whatever the planner
-- believes of them; each mark is a probe of outbox_sent's primary key (the
-- OFFSET 0 keeps PostgreSQL from turning the check into an anti-join, which
-- could read the whole table). The relay runs it with a generic plan (see
-- TryRelayLock); both tables are partitioned by created_at, each probe one
-- of every partition, a handful.
--
-- No row locks: the relay lock keeps other relays out, redrive only makes
-- rows unsent, and the maintenance drops no partition that holds one.
WITH checkpoint AS MATERIALIZED (
    SELECT resume_id, resume_xmax, resume_xip
    FROM outbox_sent
    WHERE resume_id IS NOT NULL
    ORDER BY resume_id DESC
    LIMIT 1
), base AS MATERIALIZED (
    SELECT coalesce((SELECT resume_id FROM checkpoint), 0) AS pos,
           (SELECT resume_xmax FROM checkpoint) AS xmax,
           coalesce((SELECT resume_xip FROM checkpoint), '{}') AS xip
), late AS MATERIALIZED (
    -- Rows below the position of transactions that finished since it.
    SELECT o.id FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id >= (SELECT xmax FROM base) AND o.xact_id < pg_snapshot_xmax(pg_current_snapshot())
      AND o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at OFFSET 0)
    UNION ALL
    -- And the rows of those open then, by outbox_xact_idx. The range
    -- around the list keeps a generic plan on that index: it estimates an
    -- = ANY by the table's distinct values, few when transactions write
    -- many rows (the migrated rows all have 0), and was seen reading every
    -- row below the position by the primary key instead.
    SELECT o.id FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id = ANY((SELECT xip FROM base)::xid8[])
      AND o.xact_id >= (SELECT min(x) FROM unnest((SELECT xip FROM base)) AS x)
      AND o.xact_id <= (SELECT max(x) FROM unnest((SELECT xip FROM base)) AS x)
      AND o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at OFFSET 0)
), head AS MATERIALIZED (
    SELECT o.id FROM outbox o
    WHERE o.id >= (SELECT pos FROM base)
      AND o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at OFFSET 0)
    ORDER BY o.id
    LIMIT 1
), bounds AS MATERIALIZED (
    SELECT w.lo, w.lo + @batch_size::bigint AS hi,
           EXISTS (SELECT 1 FROM late WHERE late.id >= w.lo + @batch_size::bigint) AS behind
    FROM (SELECT least((SELECT min(id) FROM late), (SELECT id FROM head)) AS lo) AS w
    WHERE w.lo IS NOT NULL
), next AS MATERIALIZED (
    SELECT
        bounds.behind OR EXISTS (
            SELECT 1 FROM outbox o
            WHERE o.id >= greatest(base.pos, bounds.hi)
              AND o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
              AND NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at OFFSET 0)
            ORDER BY o.id
            LIMIT 1
        ) AS more,
        greatest(base.pos, bounds.hi) AS resume_id,
        CASE WHEN bounds.behind THEN base.xmax ELSE pg_snapshot_xmax(pg_current_snapshot()) END AS resume_xmax,
        CASE WHEN bounds.behind THEN base.xip ELSE ARRAY(SELECT pg_snapshot_xip(pg_current_snapshot())) END AS resume_xip
    FROM bounds, base
)
SELECT o.id, o.created_at, o.event_id, o.event_type, o.source, o.subject, o.nats_subject, o.event_time, o.data, o.traceparent,
       next.more::boolean AS more,
       next.resume_id::bigint AS resume_id,
       next.resume_xmax::text::bigint AS resume_xmax,
       ARRAY(SELECT x::text::bigint FROM unnest(next.resume_xip) AS x)::bigint[] AS resume_xip,
       (SELECT coalesce(max(r.id), 0) FROM outbox_redrive r)::bigint AS epoch
FROM bounds
CROSS JOIN next
JOIN outbox o ON o.id >= bounds.lo AND o.id < bounds.hi
WHERE o.id NOT IN (SELECT unnest(@in_flight::bigint[]))
  AND NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at OFFSET 0)
ORDER BY o.id;

-- name: MarkSent :exec
-- Records the send of the acked rows @ids (ascending, with their
-- @created_ats) at clock_timestamp(), not now(): the re-drive window is
-- counted from the ack; one time for the statement, so that the position
-- that the last row carries when @resume is set (the whole batch was
-- acked, and no redrive came since its claim: @epoch) is no older than
-- any mark it covers, and a redrive that deletes one of them deletes the
-- position too. An insert, never an update: no dead tuple.
WITH t AS MATERIALIZED (
    SELECT clock_timestamp() AS at,
           @resume::boolean AND (SELECT coalesce(max(r.id), 0) FROM outbox_redrive r) = @epoch::bigint AS resumes
), m AS (
    -- Set-returning functions in one select list advance in lockstep.
    SELECT unnest(@ids::bigint[]) AS id,
           unnest(@created_ats::timestamptz[]) AS created_at,
           generate_series(1, cardinality(@ids::bigint[])) AS ord
)
INSERT INTO outbox_sent (id, created_at, sent_at, resume_id, resume_xmax, resume_xip)
SELECT m.id, m.created_at, t.at,
       CASE WHEN t.resumes AND m.ord = cardinality(@ids::bigint[]) THEN @resume_id::bigint END,
       CASE WHEN t.resumes AND m.ord = cardinality(@ids::bigint[]) THEN (@resume_xmax::bigint)::text::xid8 END,
       CASE WHEN t.resumes AND m.ord = cardinality(@ids::bigint[]) THEN ARRAY(SELECT x::text::xid8 FROM unnest(@resume_xip::bigint[]) AS x) END
FROM t, m;

-- name: UnsentLag :one
SELECT
    count(*)                                      AS unsent,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM outbox_unsent;

-- name: LockMarks :exec
-- Taken by a redrive before it deletes marks: it waits for the relay's marks
-- in progress (their positions are then deleted with the marks they cover,
-- if sent since the redrive's time) and holds off the next ones until it
-- commits (which then see its outbox_redrive row; see MarkSent). Claims,
-- which only read, go on.
LOCK TABLE outbox_sent IN SHARE ROW EXCLUSIVE MODE;

-- name: Redrive :one
-- Makes the rows sent at or after @since unsent, so the relay publishes
-- them again: harmless, because broker dedup and the consumers' inbox
-- absorb what was already delivered. It deletes their marks, and with them
-- the relay positions recorded since, so that the relay finds them (see
-- ClaimUnsent); rare, and the only delete from outbox_sent. Run after
-- LockMarks, in its transaction.
WITH deleted AS (
    DELETE FROM outbox_sent WHERE sent_at >= @since::timestamptz RETURNING 1
), recorded AS (
    INSERT INTO outbox_redrive (since, rows) SELECT @since::timestamptz, count(*) FROM deleted
    RETURNING rows
)
SELECT rows FROM recorded;

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

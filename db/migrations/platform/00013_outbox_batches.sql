-- The relay records one row per batch, its position, instead of one row per
-- event in outbox_sent, and "unsent" is defined once, from a position, by
-- outbox_unsent_after. internal/outbox (doc.go) states the invariants.
--
-- A position covers the rows sent: an outbox row r is covered when
--     r.id <= upto      AND pg_visible_in_snapshot(r.xact_id, snap)
--  or r.id <= span_done AND pg_visible_in_snapshot(r.xact_id, span_snap)
-- (xact_id is the writer's transaction). (snap, upto) is PgQ's tick: what
-- committed before a snapshot, up to an id. The span is the tick being
-- published when it holds more than a batch (a backlog, a big transaction
-- that committed late): its rows, the ones visible in span_snap up to
-- span_upto, go in id order, and those up to span_done are sent. A closed
-- position has span_snap = snap, span_upto = span_done = upto.
--
-- This migration also repairs what 00012 could lose: it recorded its
-- position before it added xact_id, so a row whose producer was in flight
-- during it got xact_id 0, below the position, and was never sent. Here the
-- outbox is locked first, so no producer is in flight, and every row that
-- no mark of outbox_sent names is made unsent again, whatever its xact_id.

-- +goose Up
-- Waits for the producers in flight and keeps new ones out until commit.
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE outbox_batch (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- When the batch's acks were in (the database clock); the re-drive
    -- window and outbox_position_before count from it, in id order.
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    snap        pg_snapshot NOT NULL,
    upto        bigint      NOT NULL,
    span_snap   pg_snapshot NOT NULL,
    span_upto   bigint      NOT NULL,
    span_done   bigint      NOT NULL,
    -- The latest outbox_redrive id when the relay's claims began: a
    -- position computed before a redrive does not override it.
    epoch       bigint      NOT NULL,
    -- The cluster whose transaction ids the snapshots and xact_id are
    -- (pg_control_system()); see outbox_cluster_changed.
    system_id   bigint      NOT NULL
);
CREATE INDEX outbox_batch_epoch_idx ON outbox_batch (epoch, id);
CREATE INDEX outbox_batch_recorded_at_idx ON outbox_batch (recorded_at);

-- A redrive is a position too: the one the relay goes back to.
ALTER TABLE outbox_redrive
    ADD COLUMN snap pg_snapshot NOT NULL DEFAULT '1:1:',
    ADD COLUMN upto bigint NOT NULL DEFAULT 0,
    ADD COLUMN span_snap pg_snapshot NOT NULL DEFAULT '1:1:',
    ADD COLUMN span_upto bigint NOT NULL DEFAULT 0,
    ADD COLUMN span_done bigint NOT NULL DEFAULT 0,
    ADD COLUMN system_id bigint;
COMMENT ON COLUMN outbox_redrive.rows IS 'the rows it made unsent';

-- +goose StatementBegin
CREATE FUNCTION outbox_system_id() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT system_identifier FROM pg_control_system()
$$;
-- +goose StatementEnd

-- THE definition of unsent: the outbox rows a position does not cover.
-- The first three branches are the rows (snap, upto) does not cover:
-- every row above upto, and below it the rows of the transactions not
-- visible in snap, those that began after it (xact_id from its xmax up)
-- and those of its running list. Each is a range or probes of an index,
-- bounded above so that a generic plan reads it as a range and not as a
-- third of the table: the cost is the rows found, whatever the outbox
-- holds. The bounds cut nothing: a row this statement sees has an id up
-- to the highest it sees and a transaction below its snapshot's xmax. The
-- span's rows are then left out (rows of a span being published, only
-- while there is a backlog).
-- +goose StatementBegin
CREATE FUNCTION outbox_unsent_after(snap pg_snapshot, upto bigint, span_snap pg_snapshot, span_done bigint)
RETURNS SETOF outbox LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        SELECT * FROM outbox
        WHERE id > upto AND id <= (SELECT max(id) FROM outbox)
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id >= pg_snapshot_xmax(snap) AND xact_id < pg_snapshot_xmax(pg_current_snapshot())
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id = ANY (ARRAY(SELECT pg_snapshot_xip(snap)))
          AND xact_id >= pg_snapshot_xmin(snap) AND xact_id < pg_snapshot_xmax(snap)
    ) AS o
    WHERE o.id > span_done OR NOT pg_visible_in_snapshot(o.xact_id, span_snap)
$$;
-- +goose StatementEnd

-- The relay's position: the latest batch recorded since the latest redrive
-- began, else that redrive's position, else the position that covers
-- nothing. A batch whose claims began before the latest redrive (epoch) is
-- left out, so a redrive is never undone by a record in flight. A view, so
-- that the claim plans it with itself, once.
CREATE VIEW outbox_position AS
WITH e AS (SELECT coalesce(max(id), 0) AS epoch FROM outbox_redrive)
SELECT p.snap, p.upto, p.span_snap, p.span_upto, p.span_done, e.epoch, p.system_id FROM e, LATERAL (
    (SELECT b.snap, b.upto, b.span_snap, b.span_upto, b.span_done, b.system_id, b.id AS ord FROM outbox_batch b
     WHERE b.epoch = e.epoch ORDER BY b.id DESC LIMIT 1)
    UNION ALL
    SELECT r.snap, r.upto, r.span_snap, r.span_upto, r.span_done, r.system_id, 0 FROM outbox_redrive r WHERE r.id = e.epoch
    UNION ALL
    SELECT '1:1:'::pg_snapshot, 0, '1:1:'::pg_snapshot, 0, 0, NULL, -1
    ORDER BY ord DESC LIMIT 1
) AS p;

-- The position as of t: the last batch recorded before the first one
-- stamped at or after t, by id, not by stamp, so that a clock that stepped
-- back cannot make it cover a row sent after t; the position that covers
-- nothing when there is none. Whatever it covers was acknowledged before t.
-- +goose StatementBegin
CREATE FUNCTION outbox_position_before(t timestamptz, OUT snap pg_snapshot, OUT upto bigint, OUT span_snap pg_snapshot,
                                       OUT span_upto bigint, OUT span_done bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.snap, p.upto, p.span_snap, p.span_upto, p.span_done FROM (
        (SELECT b.snap, b.upto, b.span_snap, b.span_upto, b.span_done, b.id FROM outbox_batch b
         WHERE b.id < coalesce((SELECT min(a.id) FROM outbox_batch a WHERE a.recorded_at >= t), 9223372036854775807)
         ORDER BY b.id DESC LIMIT 1)
        UNION ALL
        SELECT '1:1:'::pg_snapshot, 0, '1:1:'::pg_snapshot, 0, 0, -1
        ORDER BY 6 DESC LIMIT 1
    ) AS p
$$;
-- +goose StatementEnd

-- Records a position that covers every row but those of the calling
-- transaction, which must be the only writer of the outbox in flight (it
-- holds a lock that keeps producers out): its snapshot, with itself added
-- to the running list unless it is at or above the snapshot's xmax and so
-- not covered anyway. Transactions that were running stay in that list,
-- and later ones are above its xmax, so every row written from now on is
-- unsent too.
-- +goose StatementBegin
CREATE FUNCTION outbox_record_restart() RETURNS void LANGUAGE sql AS $$
    WITH s AS (
        SELECT pg_current_snapshot() AS s, pg_current_xact_id_if_assigned() AS me
    ), xip AS (
        SELECT x FROM s, pg_snapshot_xip(s.s) AS x
        UNION
        SELECT me FROM s WHERE me < pg_snapshot_xmax(s.s)
    ), pos AS (
        SELECT format('%s:%s:%s', least(pg_snapshot_xmin(s.s), (SELECT min(x) FROM xip)), pg_snapshot_xmax(s.s),
                      (SELECT coalesce(string_agg(x::text, ',' ORDER BY x), '') FROM xip))::pg_snapshot AS snap,
               coalesce((SELECT max(id) FROM outbox), 0) AS upto
        FROM s
    )
    INSERT INTO outbox_batch (snap, upto, span_snap, span_upto, span_done, epoch, system_id)
    SELECT snap, upto, snap, upto, upto, (SELECT coalesce(max(id), 0) FROM outbox_redrive), outbox_system_id()
    FROM pos
$$;
-- +goose StatementEnd

-- Why the recorded position cannot be trusted on this database, or NULL:
-- it was recorded on another cluster (a restore, a clone, a promoted
-- logical replica: their transaction ids are another cluster's), or it
-- lies beyond this cluster's next transaction id (the same, or a reset).
-- +goose StatementBegin
CREATE FUNCTION outbox_cluster_changed() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p.system_id IS NOT NULL AND p.system_id <> outbox_system_id() THEN
            format('the relay position was recorded on cluster %s, this is cluster %s', p.system_id, outbox_system_id())
        WHEN pg_snapshot_xmax(p.span_snap) > pg_snapshot_xmax(pg_current_snapshot()) THEN
            format('the relay position (xmax %s) is ahead of this cluster''s next transaction id %s',
                   pg_snapshot_xmax(p.span_snap), pg_snapshot_xmax(pg_current_snapshot()))
    END
    FROM outbox_position p
$$;
-- +goose StatementEnd

-- Starts the relay over from the rows: every row kept becomes unsent (and
-- is published again; the consumers' inbox absorbs the copies), its
-- xact_id this cluster's. For a database whose position is not this
-- cluster's (outbox_cluster_changed). Returns the rows made unsent.
-- +goose StatementBegin
CREATE FUNCTION outbox_start_over() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    LOCK TABLE outbox IN EXCLUSIVE MODE;
    UPDATE outbox SET xact_id = pg_current_xact_id();
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM outbox_record_restart();
    RETURN n;
END
$$;
-- +goose StatementEnd

-- The repair of 00012 (see the top) and the first position.
UPDATE outbox o SET xact_id = pg_current_xact_id()
WHERE NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = o.id AND s.created_at = o.created_at);
SELECT outbox_record_restart();

DROP VIEW outbox_unsent;
DROP TABLE outbox_sent;

-- The rows not yet sent, for the console, the auditor, the lag metric and
-- tests: those the relay's position does not cover.
CREATE VIEW outbox_unsent AS
SELECT o.id, o.event_id, o.event_type, o.source, o.subject, o.nats_subject, o.event_time, o.data, o.traceparent, o.created_at, o.xact_id
FROM outbox_position p, outbox_unsent_after(p.snap, p.upto, p.span_snap, p.span_done) o;

-- Whether the rows of the outbox's partition [lo, hi) are all sent, and
-- were before since, also for a redrive in progress: a redrive reads the
-- outbox, so partition_drop's lock waits for it, and its check under the
-- lock then sees its position. Index ranges and probes, not a scan.
-- +goose StatementBegin
CREATE FUNCTION outbox_all_sent(lo timestamptz, hi timestamptz, since timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM outbox_position p, outbox_unsent_after(p.snap, p.upto, p.span_snap, p.span_done) o
        WHERE o.created_at >= lo AND o.created_at < hi
    ) AND NOT EXISTS (
        SELECT 1 FROM outbox_position_before(since) p, outbox_unsent_after(p.snap, p.upto, p.span_snap, p.span_done) o
        WHERE o.created_at >= lo AND o.created_at < hi
    )
$$;
-- +goose StatementEnd

-- An outbox partition goes once outbox_all_sent says so, before the lock
-- and again under it; the check needs READ COMMITTED, so that the check
-- under the lock sees what committed while it waited. 00012's otherwise.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    began timestamptz := clock_timestamp();
    locked timestamptz;
    lo timestamptz;
    hi timestamptz;
BEGIN
    IF unsent_or_sent_since IS NOT NULL AND current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'partition_drop of an outbox partition needs READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        SELECT coalesce(p.lo, '-infinity'), p.hi INTO lo, hi FROM partitions_of(parent) p WHERE p.name = part AND NOT p.is_default;
        IF hi IS NULL OR NOT outbox_all_sent(lo, hi, unsent_or_sent_since) THEN
            RETURN false;
        END IF;
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
    locked := clock_timestamp();
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(part) AND inhparent = parent::regclass) THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL AND NOT outbox_all_sent(lo, hi, unsent_or_sent_since) THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, part);
    PERFORM partition_log_locks('partition_drop', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose Down
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
-- 00012's outbox_sent, with a mark for every row the position covers and
-- 00012's position past the lowest unsent row.
CREATE TABLE outbox_sent (
    id          bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    sent_at     timestamptz NOT NULL,
    resume_id   bigint,
    resume_xmax xid8,
    resume_xip  xid8[],
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX outbox_sent_sent_at_idx ON outbox_sent (sent_at);
CREATE INDEX outbox_sent_resume_idx ON outbox_sent (resume_id) WHERE resume_id IS NOT NULL;
-- +goose StatementBegin
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT * FROM partitions_of('outbox') LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF outbox_sent %s',
            'outbox_sent' || substr(p.name, length('outbox') + 1),
            CASE
                WHEN p.is_default THEN 'DEFAULT'
                ELSE format('FOR VALUES FROM (%s) TO (%s)',
                    coalesce(quote_literal(p.lo), 'MINVALUE'), coalesce(quote_literal(p.hi), 'MAXVALUE'))
            END);
    END LOOP;
END
$$;
-- +goose StatementEnd
INSERT INTO outbox_sent (id, created_at, sent_at)
SELECT o.id, o.created_at, now() FROM outbox o
WHERE NOT EXISTS (SELECT 1 FROM outbox_unsent u WHERE u.id = o.id);
-- Every row below the lowest unsent id is sent, and no transaction is in
-- flight: the position 00012 records there has an empty running list.
UPDATE outbox_sent s SET resume_id = r.pos, resume_xmax = pg_snapshot_xmax(pg_current_snapshot()), resume_xip = '{}'
FROM (SELECT coalesce((SELECT min(id) FROM outbox_unsent), (SELECT max(id) + 1 FROM outbox)) AS pos) AS r
WHERE s.id = (SELECT max(id) FROM outbox_sent WHERE id < r.pos);

DROP VIEW outbox_unsent;
-- +goose StatementBegin
CREATE VIEW outbox_unsent AS
WITH checkpoint AS MATERIALIZED (
    SELECT resume_id, resume_xmax, resume_xip
    FROM outbox_sent
    WHERE resume_id IS NOT NULL
    ORDER BY resume_id DESC
    LIMIT 1
), base AS MATERIALIZED (
    SELECT coalesce((SELECT resume_id FROM checkpoint), 0) AS pos,
           (SELECT resume_xmax FROM checkpoint) AS xmax,
           coalesce((SELECT resume_xip FROM checkpoint), '{}') AS xip,
           (SELECT max(id) FROM outbox) AS last
), candidates AS (
    SELECT o.* FROM outbox o
    WHERE o.id BETWEEN (SELECT pos FROM base) AND (SELECT last FROM base)
    UNION ALL
    SELECT o.* FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id >= (SELECT xmax FROM base) AND o.xact_id < pg_snapshot_xmax(pg_current_snapshot())
    UNION ALL
    SELECT o.* FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id = ANY((SELECT xip FROM base)::xid8[])
      AND o.xact_id >= (SELECT min(x) FROM unnest((SELECT xip FROM base)) AS x)
      AND o.xact_id <= (SELECT max(x) FROM unnest((SELECT xip FROM base)) AS x)
)
SELECT c.id, c.event_id, c.event_type, c.source, c.subject, c.nats_subject, c.event_time, c.data, c.traceparent, c.created_at, c.xact_id
FROM candidates c
WHERE NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = c.id AND s.created_at = c.created_at OFFSET 0);
-- +goose StatementEnd

-- 00012's partition_drop.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    kept boolean;
    began timestamptz := clock_timestamp();
    locked timestamptz;
    sent text := parent || '_sent' || substr(part, length(parent) + 1);
    keeps text := 'SELECT EXISTS (SELECT 1 FROM %1$I o WHERE NOT EXISTS (SELECT 1 FROM %3$I s WHERE s.id = o.id AND s.created_at = o.created_at))'
        ' OR EXISTS (SELECT 1 FROM %3$I WHERE sent_at >= %2$L)';
BEGIN
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        IF to_regclass(sent) IS NULL THEN
            RETURN false;
        END IF;
        EXECUTE format(keeps, part, unsent_or_sent_since, sent) INTO kept;
        IF kept THEN
            RETURN false;
        END IF;
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
    locked := clock_timestamp();
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(part) AND inhparent = parent::regclass) THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        EXECUTE format(keeps, part, unsent_or_sent_since, sent) INTO kept;
        IF kept THEN
            RETURN false;
        END IF;
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, part);
    PERFORM partition_log_locks('partition_drop', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

DROP FUNCTION outbox_all_sent(timestamptz, timestamptz, timestamptz);
DROP FUNCTION outbox_start_over();
DROP FUNCTION outbox_cluster_changed();
DROP FUNCTION outbox_record_restart();
DROP FUNCTION outbox_position_before(timestamptz);
DROP VIEW outbox_position;
DROP FUNCTION outbox_unsent_after(pg_snapshot, bigint, pg_snapshot, bigint);
DROP FUNCTION outbox_system_id();
ALTER TABLE outbox_redrive DROP COLUMN snap, DROP COLUMN upto, DROP COLUMN span_snap, DROP COLUMN span_upto, DROP COLUMN span_done, DROP COLUMN system_id;
DROP TABLE outbox_batch;

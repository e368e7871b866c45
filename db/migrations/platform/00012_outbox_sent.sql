-- The relay records a send by inserting into outbox_sent instead of
-- updating the outbox row, so that neither table has a dead tuple in
-- steady state (the marks, an UPDATE of sent_at per row, left one per
-- event until autovacuum; see docs/performance.md, "Dead tuples").
--
-- - outbox_sent is partitioned like the outbox, by the outbox row's
--   created_at with the same bounds and names (outbox_pX, outbox_sent_pX):
--   the maintenance (internal/partition) creates an outbox_sent partition
--   before the outbox's of the same range and detaches it after it, each in
--   a transaction of its own.
-- - Without an index of unsent rows the relay finds them from a position
--   recorded with its marks: the row of a mark with the highest id carries
--   the position after the claim of that batch (resume_*), read back by
--   every claim (db/queries/outbox ClaimUnsent explains it). The outbox gains
--   the id of the transaction that wrote each row (xact_id), indexed, so
--   that a row committed late below the position is found by its
--   transaction rather than by a scan.
-- - Rows written before the migration were written by finished
--   transactions: their xact_id is 0. Their sent marks move to
--   outbox_sent, and a position is recorded on the sent row whose mark is
--   the latest, so that a redrive that makes any of them unsent deletes the
--   position with it.

-- +goose Up
CREATE TABLE outbox_sent (
    id          bigint      NOT NULL,
    -- The outbox row's, the partition key of both tables.
    created_at  timestamptz NOT NULL,
    -- When the publish ack came back (the database clock); the re-drive
    -- window counts from it.
    sent_at     timestamptz NOT NULL,
    -- The relay's position after the claim of the batch this row closed
    -- (NULL on every other row): every outbox row with an id below
    -- resume_id whose transaction had finished at the claim's snapshot
    -- (xact_id below resume_xmax and not among resume_xip) was sent by
    -- this mark or before it.
    resume_id   bigint,
    resume_xmax xid8,
    resume_xip  xid8[],
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE INDEX outbox_sent_sent_at_idx ON outbox_sent (sent_at);

-- One row per redrive (db/queries/outbox Redrive), written in its
-- transaction: a relay position computed by a claim before a redrive
-- assumes sent what the redrive made unsent, so a mark records its claim's
-- position only when no redrive came in between (the latest id here is the
-- same as at the claim).
CREATE TABLE outbox_redrive (
    id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    since timestamptz NOT NULL,
    at    timestamptz NOT NULL DEFAULT now(),
    -- The marks it deleted.
    rows  bigint      NOT NULL
);
CREATE INDEX outbox_sent_resume_idx ON outbox_sent (resume_id) WHERE resume_id IS NOT NULL;

-- One partition of outbox_sent per partition of the outbox, with its bounds.
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

-- The marks move, and the position is recorded on the sent row whose mark
-- is the latest of those below it: every row below the lowest unsent id is
-- sent (every row, when none is unsent), and rows written from now on have
-- higher ids, and transaction ids from the snapshot's xmax up or among its
-- xip.
-- +goose StatementBegin
WITH pos AS (
    SELECT coalesce((SELECT min(id) FROM outbox WHERE sent_at IS NULL), (SELECT max(id) + 1 FROM outbox)) AS id
), latest AS (
    SELECT o.id
    FROM outbox o, pos
    WHERE o.id < pos.id AND o.sent_at IS NOT NULL
    ORDER BY o.sent_at DESC, o.id DESC
    LIMIT 1
)
INSERT INTO outbox_sent (id, created_at, sent_at, resume_id, resume_xmax, resume_xip)
SELECT o.id, o.created_at, o.sent_at, r.id, r.xmax, r.xip
FROM outbox o
LEFT JOIN (
    SELECT latest.id AS at, pos.id,
           pg_snapshot_xmax(pg_current_snapshot()) AS xmax,
           ARRAY(SELECT pg_snapshot_xip(pg_current_snapshot())) AS xip
    FROM latest, pos
) AS r ON r.at = o.id
WHERE o.sent_at IS NOT NULL;
-- +goose StatementEnd

ALTER TABLE outbox ADD COLUMN xact_id xid8 NOT NULL DEFAULT '0';
-- The writer's top-level transaction id (pg_current_xact_id assigns one if
-- the transaction has none yet).
ALTER TABLE outbox ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();
-- Drops outbox_unsent_idx and outbox_sent_at_idx with it.
ALTER TABLE outbox DROP COLUMN sent_at;
CREATE INDEX outbox_xact_idx ON outbox (xact_id, id);

-- The rows not yet sent, for the console, the auditor, the lag metric and
-- tests: those at or above the relay's position and those below it written
-- by a transaction that had not finished at the position's snapshot, that
-- no mark names. Each part is an index range (the first up to the last id,
-- so that a generic plan reads it as a range and not as a third of the
-- table); see ClaimUnsent.
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
    -- Below it, the rows of the transactions that had finished since...
    SELECT o.* FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id >= (SELECT xmax FROM base) AND o.xact_id < pg_snapshot_xmax(pg_current_snapshot())
    UNION ALL
    -- ...and of those that were open then. The range around the list
    -- keeps a plan on outbox_xact_idx; see ClaimUnsent.
    SELECT o.* FROM outbox o
    WHERE o.id < (SELECT pos FROM base)
      AND o.xact_id = ANY((SELECT xip FROM base)::xid8[])
      AND o.xact_id >= (SELECT min(x) FROM unnest((SELECT xip FROM base)) AS x)
      AND o.xact_id <= (SELECT max(x) FROM unnest((SELECT xip FROM base)) AS x)
)
SELECT c.id, c.event_id, c.event_type, c.source, c.subject, c.nats_subject, c.event_time, c.data, c.traceparent, c.created_at, c.xact_id
FROM candidates c
-- OFFSET 0 keeps the check a probe of outbox_sent's primary key per row:
-- an anti-join could read the whole of outbox_sent.
WHERE NOT EXISTS (SELECT 1 FROM outbox_sent s WHERE s.id = c.id AND s.created_at = c.created_at OFFSET 0);
-- +goose StatementEnd

-- An outbox partition may go once every row in it is sent and none was sent
-- at or after unsent_or_sent_since: its rows and their marks are in the
-- partitions of the same name (outbox_pX, outbox_sent_pX). The function is
-- 00011's otherwise.
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
    -- Another maintainer of the database (a second replica of the
    -- service) may have detached it, or dropped it, since it was listed.
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        -- Without its outbox_sent partition (it cannot be: it is made
        -- first and detached after) every row would count as unsent.
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
    -- Again under the lock: a redrive may have deleted marks since. Reading
    -- outbox_sent's partition takes its ACCESS SHARE lock, which the
    -- relay's marks (ROW EXCLUSIVE) do not conflict with: the relay, which
    -- locks outbox_sent before the outbox, cannot deadlock with this.
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

-- +goose Down
-- 00011's partition_drop.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    kept boolean;
    began timestamptz := clock_timestamp();
    locked timestamptz;
    keeps text := 'SELECT EXISTS (SELECT 1 FROM %1$I WHERE sent_at IS NULL) OR EXISTS (SELECT 1 FROM %1$I WHERE sent_at >= %2$L)';
BEGIN
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        EXECUTE format(keeps, part, unsent_or_sent_since) INTO kept;
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
        EXECUTE format(keeps, part, unsent_or_sent_since) INTO kept;
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

DROP VIEW outbox_unsent;
DROP TABLE outbox_redrive;
ALTER TABLE outbox ADD COLUMN sent_at timestamptz;
UPDATE outbox o SET sent_at = s.sent_at
FROM outbox_sent s
WHERE s.id = o.id AND s.created_at = o.created_at;
DROP INDEX outbox_xact_idx;
ALTER TABLE outbox DROP COLUMN xact_id;
CREATE INDEX outbox_unsent_idx ON outbox (id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_at_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;
SELECT partition_drop_detached('outbox_sent');
DROP TABLE outbox_sent;

-- The partition steps of 00008, holding the locks that writers wait behind
-- for less. bench/soak.sh measured the longest step at 108–324 ms under a
-- load average of 50, its lock waits included, and found writers waiting
-- behind a drop for up to 283 ms, most of it the drop's COMMIT: a
-- transaction that drops a table flushes the WAL at commit whatever
-- synchronous_commit says, and holds its locks until the flush is done.
--
-- - partition_create builds the new table with its indexes before it
--   takes a lock that anyone waits behind; ATTACH then adopts the indexes
--   instead of building them while it holds the DEFAULT partition's ACCESS
--   EXCLUSIVE lock (which every statement that reads the whole table on a
--   generic plan, the relay's claim and marks, waits behind). It locks
--   the DEFAULT partition before the ATTACH only when there are rows to
--   move out of it.
-- - partition_drop detaches the partition instead of dropping it, and
--   partition_drop_detached drops it afterwards, in a transaction of its
--   own that holds no lock of the table's: the commit that flushes is no
--   longer under the table's lock. A partition left detached (a process
--   that stopped in between) goes at the next round.
-- - Both commit without waiting for the WAL flush (synchronous_commit off
--   for the step): a crash that loses the step undoes it, and the next
--   round does it again; a write into a new partition commits after it,
--   and its flush flushes the step's commit too.
-- - partition_drop checks that an outbox partition may go before it locks
--   the table, so that a kept partition costs no lock, and checks again
--   under the lock.
-- - Both log how long they took before they had their locks and how long
--   they held them, up to their commit, when log_lock_waits is on (the
--   soak turns it on; it is off by default).
--
-- The signatures are those of 00008, so their sqlc queries are unchanged.

-- +goose Up

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_create(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text, exclusive boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := format('%s_p%s', parent, to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS'));
    dflt text;
    moving boolean := false;
    began timestamptz := clock_timestamp();
    locked timestamptz;
BEGIN
    IF to_regclass(part) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    -- SHARE UPDATE EXCLUSIVE, which writers do not wait for, keeps a
    -- second maintainer out until this one commits.
    EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', parent);
    IF to_regclass(part) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', part, parent);
    IF exclusive THEN
        EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
        locked := clock_timestamp();
    END IF;
    SELECT p.name INTO dflt FROM partitions_of(parent) p WHERE p.is_default;
    IF dflt IS NOT NULL THEN
        -- Looked at before it is locked, as it is empty but for a new
        -- database or a maintenance that fell behind. A row of the range
        -- that comes after the look makes the ATTACH fail (it checks the
        -- DEFAULT partition under its lock) and the next round move it.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %1$I WHERE %2$I >= %3$L AND %2$I < %4$L)', dflt, key, lo, hi) INTO moving;
    END IF;
    IF moving THEN
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', dflt);
        locked := coalesce(locked, clock_timestamp());
        EXECUTE format('WITH moved AS (DELETE FROM %1$I WHERE %3$I >= %4$L AND %3$I < %5$L RETURNING *) INSERT INTO %2$I SELECT * FROM moved',
            dflt, part, key, lo, hi);
    END IF;
    -- ATTACH locks the DEFAULT partition ACCESS EXCLUSIVE itself.
    locked := coalesce(locked, clock_timestamp());
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
    PERFORM partition_log_locks('partition_create', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    kept boolean;
    began timestamptz := clock_timestamp();
    locked timestamptz;
    keeps text := 'SELECT EXISTS (SELECT 1 FROM %1$I WHERE sent_at IS NULL) OR EXISTS (SELECT 1 FROM %1$I WHERE sent_at >= %2$L)';
BEGIN
    -- Another maintainer of the database (a second replica of the
    -- service) may have detached it, or dropped it, since it was listed.
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
    -- Again under the lock: a redrive may have marked rows unsent since.
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

-- Drops the tables partition_drop detached from parent: those named as its
-- partitions are that are no partition of it. A partition being made is
-- not among them: it is attached in the transaction that creates it.
-- Returns how many it dropped.
-- +goose StatementBegin
CREATE FUNCTION partition_drop_detached(parent text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    part text;
    dropped integer := 0;
BEGIN
    FOR part IN
        SELECT c.relname FROM pg_catalog.pg_class c
        WHERE c.relkind = 'r' AND NOT c.relispartition
          AND c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = parent::regclass)
          AND c.relname ~ ('^' || parent || '_(p[0-9]{8}_[0-9]{6}|legacy)$')
    LOOP
        -- IF EXISTS: another maintainer may be dropping it too.
        EXECUTE format('DROP TABLE IF EXISTS %I', part);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;
-- +goose StatementEnd

-- Logs, when log_lock_waits is on, how long a partition step took before
-- it had the locks writers wait behind (its waits for them included) and
-- how long it has held them (until now; its commit follows). "held" comes last: bench/soak.sh reads the last
-- "N ms" of the line.
-- +goose StatementBegin
CREATE FUNCTION partition_log_locks(step text, part text, began timestamptz, locked timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('log_lock_waits')::boolean THEN
        RAISE LOG '% %: % ms before its locks, held them % ms',
            step, part,
            round(extract(epoch FROM coalesce(locked, clock_timestamp()) - began) * 1000, 1),
            round(extract(epoch FROM clock_timestamp() - coalesce(locked, clock_timestamp())) * 1000, 1);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- 00008's steps, which do not log.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_create(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text, exclusive boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := format('%s_p%s', parent, to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS'));
    dflt text;
BEGIN
    IF to_regclass(part) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    EXECUTE format('LOCK TABLE ONLY %I IN %s MODE', parent,
        CASE WHEN exclusive THEN 'ACCESS EXCLUSIVE' ELSE 'SHARE UPDATE EXCLUSIVE' END);
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part, parent);
    SELECT p.name INTO dflt FROM partitions_of(parent) p WHERE p.is_default;
    IF dflt IS NOT NULL THEN
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', dflt);
        EXECUTE format('WITH moved AS (DELETE FROM %1$I WHERE %3$I >= %4$L AND %3$I < %5$L RETURNING *) INSERT INTO %2$I SELECT * FROM moved',
            dflt, part, key, lo, hi);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    kept boolean;
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
    IF unsent_or_sent_since IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %1$I WHERE sent_at IS NULL) OR EXISTS (SELECT 1 FROM %1$I WHERE sent_at >= %2$L)',
            part, unsent_or_sent_since) INTO kept;
        IF kept THEN
            RETURN false;
        END IF;
    END IF;
    EXECUTE format('DROP TABLE %I', part);
    RETURN true;
END
$$;
-- +goose StatementEnd

SELECT partition_drop_detached('processed_events'), partition_drop_detached('outbox');
DROP FUNCTION partition_drop_detached(text);
DROP FUNCTION partition_log_locks(text, text, timestamptz, timestamptz);

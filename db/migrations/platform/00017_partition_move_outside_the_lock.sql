-- Rows that wait in a DEFAULT partition were moved into their partition by
-- partition_create under the DEFAULT partition's ACCESS EXCLUSIVE lock (and
-- the table's, for a range where writes may be under way): 200,000 waiting
-- claims held writers 1.46 s at load 6, and a move longer than the
-- statement timeout was cancelled every round, moving nothing. ATTACH also
-- scanned the whole DEFAULT partition under that lock, and the new
-- partition too. Now a range whose rows wait in DEFAULT is moved in steps,
-- each a statement of its own that holds no lock a writer waits behind for
-- longer than a catalog change:
--
--   1. partition_move_begin creates the partition's table, unattached, with
--      a CHECK of its bounds, and adds to the DEFAULT partition a CHECK
--      NOT VALID, named as the partition, that refuses a row of the range.
--      From its commit on, a write of the range into DEFAULT fails
--      (check_violation, 23514: loud, and retried by the inbox as any
--      transient failure): a duplicate claim cannot go to DEFAULT while its
--      first claim is on its way into the new table, out of sight of the
--      claim. Adding the CHECK locks DEFAULT for a catalog change, waiting
--      at most lock_timeout, and waits for its writers in flight.
--   2. partition_move_batch moves at most n rows of the range from DEFAULT
--      into the table per call, each call its own transaction. In the
--      outbox only rows the relay's position covers (sent) move: a sent row
--      out of sight for a while costs the relay's claim nothing, an unsent
--      one would be skipped. The outbox's unsent rows of the range stay
--      until the relay sends them.
--   3. partition_move_validate validates the CHECK, scanning DEFAULT under
--      SHARE UPDATE EXCLUSIVE, which no writer waits for.
--   4. partition_create adopts the table: ATTACH skips the scan of the new
--      table (its CHECK implies the bounds) and of DEFAULT (its validated
--      CHECK implies no row of the range is there), so the lock it holds is
--      held for a catalog change, and the DEFAULT's CHECK goes in the same
--      transaction.
--
-- The DEFAULT's CHECK, named as the table, marks the table as being filled:
-- partition_drop_detached leaves it alone. The maintenance takes these
-- steps whenever the DEFAULT partition is larger than a few hundred kB
-- (partition_default_larger), also for a range it holds no row of (begin,
-- validate, attach: no row moves), so that no ATTACH scans a large DEFAULT
-- under its lock; a smaller one is moved and scanned under the lock, as
-- before, in a few ms.
--
-- partition_create compares bounds when the partition's name is taken: a
-- partition of that name with other bounds (made by hand, or by a replica
-- whose interval differs) raises, instead of being taken for the partition
-- the maintenance wanted.
--
-- partition_clean_default deletes, in batches, the rows of a DEFAULT
-- partition below the table's floor, which no partition will ever take:
-- DEFAULT partitions were never cleaned.
--
-- partition_floor_without: when the lowest partition goes, the floor is its
-- upper bound, not the next partition's lower bound, so that a gap above
-- it (a partition that was never made) is not refused while it is within
-- the retention. A gap is refilled by the maintenance (internal/partition,
-- missing) unless DEFAULT holds rows of it.

-- +goose Up

-- The name of the partition of parent that starts at lo.
-- +goose StatementBegin
CREATE FUNCTION partition_name(parent text, lo timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('%s_p%s', parent, to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS'))
$$;
-- +goose StatementEnd

-- The DEFAULT partition of parent, or NULL.
-- +goose StatementBegin
CREATE FUNCTION partition_default(parent text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT p.name FROM partitions_of(parent) p WHERE p.is_default
$$;
-- +goose StatementEnd

-- Whether the DEFAULT partition of parent takes more than bytes on disk,
-- rows or the dead tuples of rows moved out of it until a vacuum: an
-- ATTACH would scan it under its ACCESS EXCLUSIVE lock, and partition_create
-- move its rows of the range under that lock. At most a few hundred kB
-- take a few ms, and a partition is made in one step.
-- +goose StatementBegin
CREATE FUNCTION partition_default_larger(parent text, bytes bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(pg_relation_size(to_regclass(partition_default(parent))) > bytes, false)
$$;
-- +goose StatementEnd

-- Step 1 (see the top). Returns false when the partition exists attached.
-- +goose StatementBegin
CREATE FUNCTION partition_move_begin(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := partition_name(parent, lo);
    dflt text := partition_default(parent);
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(part)) THEN
        RETURN false;
    END IF;
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', part, parent);
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (%I IS NOT NULL AND %I >= %L AND %I < %L)',
            part, part || '_bounds', key, key, lo, key, hi);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = dflt::regclass AND conname = part) THEN
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (%I < %L OR %I >= %L) NOT VALID',
            dflt, part, key, lo, key, hi);
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- Step 2: moves at most n rows of [lo, hi) from DEFAULT into the table of
-- step 1, in the outbox (sent_only) only those the relay's position covers.
-- left_behind: how many rows of the range are still in DEFAULT, counted up
-- to n + 1.
-- +goose StatementBegin
CREATE FUNCTION partition_move_batch(parent text, key text, lo timestamptz, hi timestamptz, n integer, sent_only boolean,
                                     OUT moved integer, OUT left_behind integer)
LANGUAGE plpgsql AS $$
DECLARE
    part text := partition_name(parent, lo);
    dflt text := partition_default(parent);
    sent text := CASE WHEN sent_only THEN
        'AND EXISTS (SELECT 1 FROM outbox_position p WHERE outbox_covered(d.id, d.xact_id, p.snap, p.upto, p.span_snap, p.span_done))'
        ELSE '' END;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = dflt::regclass AND conname = part) THEN
        RAISE EXCEPTION 'partition_move_batch: no move of % under way', part;
    END IF;
    EXECUTE format('WITH moved AS (DELETE FROM %1$I WHERE ctid = ANY (ARRAY(
                        SELECT d.ctid FROM %1$I d WHERE d.%3$I >= %4$L AND d.%3$I < %5$L %6$s LIMIT %7$s))
                    RETURNING *)
                    INSERT INTO %2$I SELECT * FROM moved', dflt, part, key, lo, hi, sent, n);
    GET DIAGNOSTICS moved = ROW_COUNT;
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %1$I WHERE %2$I >= %3$L AND %2$I < %4$L LIMIT %5$s) AS l', dflt, key, lo, hi, n + 1)
        INTO left_behind;
END
$$;
-- +goose StatementEnd

-- Step 3.
-- +goose StatementBegin
CREATE FUNCTION partition_move_validate(parent text, lo timestamptz, lock_timeout text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', partition_default(parent), partition_name(parent, lo));
END
$$;
-- +goose StatementEnd

-- 00011's, but that it adopts the table of a move (step 4), compares the
-- bounds of a partition whose name is taken, and names through
-- partition_name.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_create(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text, exclusive boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := partition_name(parent, lo);
    dflt text;
    moving boolean := false;
    adopting boolean;
    began timestamptz := clock_timestamp();
    locked timestamptz;
    taken record;
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    -- SHARE UPDATE EXCLUSIVE, which writers do not wait for, keeps a
    -- second maintainer out until this one commits.
    EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', parent);
    dflt := partition_default(parent);
    SELECT p.lo AS lo, p.hi AS hi INTO taken FROM partitions_of(parent) p WHERE p.name = part;
    IF FOUND THEN
        IF taken.lo IS DISTINCT FROM lo OR taken.hi IS DISTINCT FROM hi THEN
            RAISE EXCEPTION 'partition % of % exists with bounds [%, %), not [%, %)', part, parent, taken.lo, taken.hi, lo, hi;
        END IF;
        RETURN false;
    END IF;
    adopting := dflt IS NOT NULL AND to_regclass(part) IS NOT NULL
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = dflt::regclass AND conname = part);
    IF NOT adopting THEN
        -- A leftover a drop detached that a session still holds: dropped
        -- at a later round, and the partition made then.
        IF to_regclass(part) IS NOT NULL THEN
            RETURN false;
        END IF;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', part, parent);
    END IF;
    IF exclusive THEN
        EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
        locked := clock_timestamp();
    END IF;
    -- Rows of the range in DEFAULT (a small DEFAULT, or the outbox's last
    -- unsent rows, at most a batch) are moved here, under the DEFAULT
    -- partition's lock; not looked for when DEFAULT's validated CHECK rules
    -- them out. A row of the range that comes after the look makes the
    -- ATTACH fail, and the next round move it.
    IF dflt IS NOT NULL AND NOT (adopting AND (SELECT k.convalidated FROM pg_catalog.pg_constraint k
                                               WHERE k.conrelid = dflt::regclass AND k.conname = part)) THEN
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
    IF adopting THEN
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', dflt, part);
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS %I', part, part || '_bounds');
    END IF;
    PERFORM partition_log_locks('partition_create', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- 00015's, but that it leaves alone a table being filled by a move (a
-- CHECK of the DEFAULT partition named as it).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop_detached(parent text, lock_timeout text, OUT dropped integer, OUT locked integer)
LANGUAGE plpgsql AS $$
DECLARE
    part text;
    dflt regclass := to_regclass(partition_default(parent));
BEGIN
    dropped := 0;
    locked := 0;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    FOR part IN
        SELECT c.relname FROM pg_catalog.pg_class c
        WHERE c.relkind = 'r' AND NOT c.relispartition
          AND c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = parent::regclass)
          AND c.relname ~ ('^' || parent || '_(p[0-9]{8}_[0-9]{6}|legacy)$')
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k WHERE k.conrelid = dflt AND k.conname = c.relname)
    LOOP
        BEGIN
            -- IF EXISTS: another maintainer may be dropping it too.
            EXECUTE format('DROP TABLE IF EXISTS %I', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            locked := locked + 1;
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- Deletes at most n rows of the DEFAULT partition of parent that lie
-- below its floor, which no partition will take (none is made below it):
-- in processed_events claims that the floor's trigger refuses whether the
-- row is there or not; in the outbox (sent_since not NULL) only once every
-- outbox row below the floor was sent before sent_since (outbox_all_sent).
-- Returns how many it deleted. A DELETE takes no lock a writer waits for.
-- +goose StatementBegin
CREATE FUNCTION partition_clean_default(parent text, key text, n integer, sent_since timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    dflt text := partition_default(parent);
    lowest timestamptz;
    deleted integer;
BEGIN
    SELECT f.lo INTO lowest FROM partition_floor f WHERE f.parent = partition_clean_default.parent;
    IF dflt IS NULL OR lowest IS NULL THEN
        RETURN 0;
    END IF;
    IF sent_since IS NOT NULL AND NOT outbox_all_sent('-infinity', lowest, sent_since) THEN
        RETURN 0;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('DELETE FROM %1$I WHERE ctid = ANY (ARRAY(SELECT ctid FROM %1$I WHERE %2$I < %3$L LIMIT %4$s))',
        dflt, key, lowest, n);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;
-- +goose StatementEnd

-- 00014's, but the floor once the lowest partition goes is its upper
-- bound (see the top).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_floor_without(parent text, part text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name <> part) IS NULL
                  OR min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name <> part) > min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name = part)
                THEN max(p.hi) FILTER (WHERE p.name = part)
                ELSE min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name <> part) END
    FROM partitions_of(parent) p
    WHERE NOT p.is_default
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_floor_without(parent text, part text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name <> part),
                    max(p.hi) FILTER (WHERE p.name = part))
    FROM partitions_of(parent) p
    WHERE NOT p.is_default
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop_detached(parent text, lock_timeout text, OUT dropped integer, OUT locked integer)
LANGUAGE plpgsql AS $$
DECLARE
    part text;
BEGIN
    dropped := 0;
    locked := 0;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    FOR part IN
        SELECT c.relname FROM pg_catalog.pg_class c
        WHERE c.relkind = 'r' AND NOT c.relispartition
          AND c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = parent::regclass)
          AND c.relname ~ ('^' || parent || '_(p[0-9]{8}_[0-9]{6}|legacy)$')
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE IF EXISTS %I', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            locked := locked + 1;
        END;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- 00011's partition_create.
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
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %1$I WHERE %2$I >= %3$L AND %2$I < %4$L)', dflt, key, lo, hi) INTO moving;
    END IF;
    IF moving THEN
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', dflt);
        locked := coalesce(locked, clock_timestamp());
        EXECUTE format('WITH moved AS (DELETE FROM %1$I WHERE %3$I >= %4$L AND %3$I < %5$L RETURNING *) INSERT INTO %2$I SELECT * FROM moved',
            dflt, part, key, lo, hi);
    END IF;
    locked := coalesce(locked, clock_timestamp());
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
    PERFORM partition_log_locks('partition_create', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

DROP FUNCTION partition_clean_default(text, text, integer, timestamptz);
DROP FUNCTION partition_move_validate(text, timestamptz, text);
DROP FUNCTION partition_move_batch(text, text, timestamptz, timestamptz, integer, boolean);
DROP FUNCTION partition_move_begin(text, text, timestamptz, timestamptz, text);
DROP FUNCTION partition_default_larger(text, bigint);
DROP FUNCTION partition_default(text);
DROP FUNCTION partition_name(text, timestamptz);

-- Two replicas' maintenance rounds that ran at once failed now and then:
--
--   - Two drops of the same outbox partition each read the outbox
--     (outbox_all_sent, before the lock), then each waited for the other's
--     read to lock the table out: a deadlock (40P01), one round failing a
--     second later. partition_drop now takes the table's SHARE UPDATE
--     EXCLUSIVE lock first, as partition_create does: it conflicts with
--     itself and with nothing writers or the relay take, so one maintainer
--     at a time reads and detaches, and the other, let in after, finds the
--     partition gone.
--   - A partition dropped by one while the other listed the partitions
--     came back with no bound (pg_get_expr of a relation gone is NULL), a
--     row the maintenance could not read. partitions_of leaves it out.
--   - Two moves of the same range (00017): the second's partition_move_begin
--     created the table the first had just created (a duplicate), and once
--     the first had attached it, the second's batches and validation found
--     no move under way and raised. partition_move_begin takes the same
--     lock; a batch or a validation of a move another maintainer finished
--     does nothing.

-- +goose Up

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partitions_of(parent text)
RETURNS TABLE (name text, lo timestamptz, hi timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    WITH b AS MATERIALIZED (
        SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent::regclass
    )
    SELECT b.name,
           (regexp_match(b.bound, 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
           (regexp_match(b.bound, 'TO \(''([^'']*)''\)'))[1]::timestamptz,
           b.bound = 'DEFAULT'
    FROM b
    WHERE b.bound IS NOT NULL
$$;
-- +goose StatementEnd

-- 00014's, but that it takes parent's SHARE UPDATE EXCLUSIVE lock first.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    began timestamptz := clock_timestamp();
    locked timestamptz;
    lo timestamptz;
    hi timestamptz;
    members oid[];
    lowest timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'partition_drop needs READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', parent);
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL THEN
        SELECT coalesce(p.lo, '-infinity'), p.hi INTO lo, hi FROM partitions_of(parent) p WHERE p.name = part AND NOT p.is_default;
        IF hi IS NULL OR NOT outbox_all_sent(lo, hi, unsent_or_sent_since) THEN
            RETURN false;
        END IF;
    END IF;
    SELECT array_agg(inhrelid ORDER BY inhrelid) INTO members FROM pg_catalog.pg_inherits WHERE inhparent = parent::regclass;
    lowest := partition_floor_without(parent, part);
    EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', parent);
    locked := clock_timestamp();
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(part) AND inhparent = parent::regclass) THEN
        RETURN false;
    END IF;
    IF unsent_or_sent_since IS NOT NULL AND NOT outbox_all_sent(lo, hi, unsent_or_sent_since) THEN
        RETURN false;
    END IF;
    IF (SELECT array_agg(inhrelid ORDER BY inhrelid) FROM pg_catalog.pg_inherits WHERE inhparent = parent::regclass) IS DISTINCT FROM members THEN
        lowest := partition_floor_without(parent, part);
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, part);
    PERFORM partition_floor_raise(parent, lowest);
    PERFORM partition_log_locks('partition_drop', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- 00017's, but that it takes parent's SHARE UPDATE EXCLUSIVE lock first.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_begin(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := partition_name(parent, lo);
    dflt text := partition_default(parent);
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', parent);
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

-- 00017's, but that a move another maintainer finished (the partition
-- attached) moves nothing and leaves nothing behind.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_batch(parent text, key text, lo timestamptz, hi timestamptz, n integer, sent_only boolean,
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
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = to_regclass(part) AND inhparent = parent::regclass) THEN
            moved := 0;
            left_behind := 0;
            RETURN;
        END IF;
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

-- 00017's, but that a move another maintainer finished is left alone.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_validate(parent text, lo timestamptz, lock_timeout text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid = to_regclass(partition_default(parent)) AND conname = partition_name(parent, lo)) THEN
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', partition_default(parent), partition_name(parent, lo));
END
$$;
-- +goose StatementEnd

-- +goose Down
-- 00008's partitions_of, 00014's partition_drop, 00017's move steps.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partitions_of(parent text)
RETURNS TABLE (name text, lo timestamptz, hi timestamptz, is_default boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz,
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    began timestamptz := clock_timestamp();
    locked timestamptz;
    lo timestamptz;
    hi timestamptz;
    members oid[];
    lowest timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'partition_drop needs READ COMMITTED, not %', current_setting('transaction_isolation');
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
    SELECT array_agg(inhrelid ORDER BY inhrelid) INTO members FROM pg_catalog.pg_inherits WHERE inhparent = parent::regclass;
    lowest := partition_floor_without(parent, part);
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
    IF (SELECT array_agg(inhrelid ORDER BY inhrelid) FROM pg_catalog.pg_inherits WHERE inhparent = parent::regclass) IS DISTINCT FROM members THEN
        lowest := partition_floor_without(parent, part);
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, part);
    PERFORM partition_floor_raise(parent, lowest);
    PERFORM partition_log_locks('partition_drop', part, began, locked);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_begin(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_batch(parent text, key text, lo timestamptz, hi timestamptz, n integer, sent_only boolean,
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_move_validate(parent text, lo timestamptz, lock_timeout text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout, true);
    PERFORM set_config('synchronous_commit', 'off', true);
    EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT %I', partition_default(parent), partition_name(parent, lo));
END
$$;
-- +goose StatementEnd

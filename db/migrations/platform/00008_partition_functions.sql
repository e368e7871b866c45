-- Functions of the partitioned inbox and outbox (00009, 00010) and of their
-- maintenance (internal/partition), which runs them through sqlc queries
-- (db/queries/partition): partitions are named and bounded at run time, so
-- their DDL is built here, in one place, and not in Go.

-- +goose Up

-- The time in a UUIDv7 (RFC 9562): its first 48 bits count milliseconds
-- since the epoch. An event's id is a UUIDv7 (the envelope requires it),
-- so this is the time the event was minted: the same for every delivery of
-- the event, whatever its envelope says. PostgreSQL 15 has no
-- uuid_extract_timestamp (18 has). Go computes the same (event.Minted).
-- +goose StatementBegin
CREATE FUNCTION uuid7_time(id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT to_timestamp(('x' || lpad(left(replace(id::text, '-', ''), 12), 16, '0'))::bit(64)::bigint / 1000.0)
$$;
-- +goose StatementEnd

-- The partitions of a partitioned table, with their bounds: lo is NULL for
-- a partition FROM (MINVALUE), and both for the DEFAULT partition.
-- +goose StatementBegin
CREATE FUNCTION partitions_of(parent text)
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

-- Adds the partition [lo, hi) to parent, partitioned by key. Rows that
-- landed in the DEFAULT partition in that range (before the maintenance
-- made the partition: a new database, a maintenance that fell behind) are
-- moved into it first. The new table is attached, which takes only a SHARE
-- UPDATE EXCLUSIVE lock on parent (writers carry on) for a range in the
-- future, where nobody writes yet. For a range where writes may be under
-- way (exclusive), parent is locked ACCESS EXCLUSIVE: a transaction that
-- holds the table from before the attach would still route a row of the
-- range to the DEFAULT partition, and fail its constraint. The DEFAULT
-- partition is locked ACCESS EXCLUSIVE while it is checked, for as long as
-- its rows in the range take to move, normally none. Every lock is waited
-- for at most lock_timeout (lock_not_available otherwise: the caller
-- retries). Returns false when the partition existed already.
-- +goose StatementBegin
CREATE FUNCTION partition_create(parent text, key text, lo timestamptz, hi timestamptz, lock_timeout text, exclusive boolean)
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

-- Drops a partition of parent. Dropping takes parent's ACCESS EXCLUSIVE
-- lock, waited for at most lock_timeout and held only for the drop itself
-- (a catalog change; the files go at commit). Parent is locked first, as
-- writers lock it, so that the two cannot deadlock. unsent_or_sent_since,
-- when not NULL, keeps an outbox partition that holds a row unsent or sent
-- at or after it, checked under the lock, so that a concurrent redrive
-- cannot slip in between. Returns whether it dropped the partition.
-- +goose StatementBegin
CREATE FUNCTION partition_drop(parent text, part text, lock_timeout text, unsent_or_sent_since timestamptz)
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

-- +goose Down
DROP FUNCTION partition_drop(text, text, text, timestamptz);
DROP FUNCTION partition_create(text, text, timestamptz, timestamptz, text, boolean);
DROP FUNCTION partitions_of(text);
DROP FUNCTION uuid7_time(uuid);

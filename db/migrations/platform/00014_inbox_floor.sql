-- The inbox refuses, in the claim's transaction, an event minted before the
-- oldest partition of processed_events. The consumers' retention guard
-- (internal/inbox, decode.go) refuses by each consumer's own setting, and
-- each replica's maintenance drops by its own: in a rolling change of
-- INBOX_RETENTION a replica on the shorter value drops partitions that a
-- replica on the longer one still admits, and the claim of such an event
-- landed in processed_events_default as a first claim, its effect applied
-- again. The partitions that exist are the one truth every replica shares.
--
-- - partition_floor holds, per partitioned table, the lowest lower bound
--   of its partitions but DEFAULT ('-infinity' for one FROM (MINVALUE)).
--   partition_drop raises it in the transaction that detaches, so it
--   changes when the partitions do, for every reader after the commit (to
--   the dropped partition's upper bound if no other is left: a range once
--   dropped stays refused). partition_create makes partitions only above
--   it (the maintenance adds them from the highest bound on) and leaves it
--   alone. Until a table's first drop it may have no row: nothing was
--   dropped, so nothing is refused.
-- - A row can only be below the lowest partition in the DEFAULT partition,
--   so the check is a trigger on processed_events_default: claims that go
--   to their partition, all of them while the maintenance keeps up, pay
--   nothing; one that goes to DEFAULT reads one row. It raises OF001
--   (internal/inbox: dead-lettered as the retention guard's refusals are).
--   An operator's replay forced past the retention sets
--   onceflow.claim_past_retention for its transaction and is let through.
-- - Under READ COMMITTED the trigger's read sees every drop that committed
--   before the claim had its lock on processed_events (a drop holds the
--   table's ACCESS EXCLUSIVE lock until it commits). A transaction with an
--   older snapshot (REPEATABLE READ) locks the row instead, which fails
--   with serialization_failure (retried) when a drop changed it since.

-- +goose Up
CREATE TABLE partition_floor (
    parent text        PRIMARY KEY,
    lo     timestamptz NOT NULL
);

-- The floor of parent once part is detached: the lowest lower bound of its
-- other partitions but DEFAULT, or part's upper bound if it has none. It
-- reads every partition's bound (a few ms for a week of hourly partitions:
-- partition_drop works it out before its lock).
-- +goose StatementBegin
CREATE FUNCTION partition_floor_without(parent text, part text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(min(coalesce(p.lo, '-infinity')) FILTER (WHERE p.name <> part),
                    max(p.hi) FILTER (WHERE p.name = part))
    FROM partitions_of(parent) p
    WHERE NOT p.is_default
$$;
-- +goose StatementEnd

-- Raises parent's floor to lowest; it never goes down (partitions are made
-- above it), so a range once dropped stays refused.
-- +goose StatementBegin
CREATE FUNCTION partition_floor_raise(parent text, lowest timestamptz) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO partition_floor AS f (parent, lo) VALUES (partition_floor_raise.parent, partition_floor_raise.lowest)
    ON CONFLICT (parent) DO UPDATE SET lo = excluded.lo WHERE f.lo < excluded.lo;
$$;
-- +goose StatementEnd

INSERT INTO partition_floor (parent, lo)
SELECT t, min(coalesce(p.lo, '-infinity'))
FROM unnest(ARRAY['processed_events', 'outbox']) AS t, partitions_of(t) AS p
WHERE NOT p.is_default
GROUP BY t;

-- +goose StatementBegin
CREATE FUNCTION processed_events_refuse_below_floor() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    lowest timestamptz;
BEGIN
    IF current_setting('onceflow.claim_past_retention', true) = 'on' THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT f.lo INTO lowest FROM partition_floor f WHERE f.parent = 'processed_events';
    ELSE
        SELECT f.lo INTO lowest FROM partition_floor f WHERE f.parent = 'processed_events' FOR SHARE;
    END IF;
    IF NEW.minted_at < lowest THEN
        RAISE EXCEPTION 'event % was minted at %, before the oldest partition of processed_events (from %): beyond the inbox retention, it may have been processed already',
            NEW.event_id, NEW.minted_at, lowest
            USING ERRCODE = 'OF001';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER processed_events_refuse_below_floor BEFORE INSERT ON processed_events_default
    FOR EACH ROW EXECUTE FUNCTION processed_events_refuse_below_floor();

-- 00013's, and the floor raised past a partition detached from the bottom
-- in the transaction that detaches it. It is worked out before the lock,
-- and again under it only if another maintainer changed the partitions
-- while this one waited, so that the lock is held for a catalog change and
-- a look at pg_inherits. Every drop needs READ COMMITTED now: the look
-- under the lock must see what committed while it waited.
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

-- +goose Down
DROP TRIGGER processed_events_refuse_below_floor ON processed_events_default;
DROP FUNCTION processed_events_refuse_below_floor();
-- 00013's partition_drop.
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

DROP FUNCTION partition_floor_raise(text, timestamptz);
DROP FUNCTION partition_floor_without(text, text);
DROP TABLE partition_floor;

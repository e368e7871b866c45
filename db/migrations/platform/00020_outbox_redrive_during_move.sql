-- A redrive that ran while rows moved out of the outbox's DEFAULT
-- partition (00017) missed them: a move takes sent rows out of sight of
-- the relay's claim, into the partition's unattached table, until the
-- ATTACH; a redrive in that while made the relay publish again the rows it
-- saw, and its position then moved past the rows out of sight, which were
-- never published again. Now:
--
--   - A redrive is refused while a move of the outbox is under way (the
--     DEFAULT partition's CHECK named as the partition, 00017), with
--     object_in_use (55006) and a message that says to try again once the
--     maintenance has made the partition: a trigger on outbox_redrive,
--     which every redrive inserts into.
--   - A batch of a move takes outbox_redrive's SHARE lock first, which
--     waits for a redrive in flight to commit and keeps one from starting
--     until the batch commits: a batch moves only rows the relay's
--     position covers (outbox_position, which a committed redrive resets),
--     so a redrive that committed before the batch took its snapshot, or
--     one whose check came before the move began, is seen by the batch,
--     and the rows it makes unsent stay in sight.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION outbox_redrive_refuse_during_move() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    moving text;
BEGIN
    SELECT k.conname INTO moving FROM pg_catalog.pg_constraint k
    WHERE k.conrelid = to_regclass(partition_default('outbox')) AND k.contype = 'c'
      AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relname = k.conname AND NOT c.relispartition)
    LIMIT 1;
    IF moving IS NOT NULL THEN
        RAISE EXCEPTION 'outbox redrive refused: the partition % is being filled from the outbox''s DEFAULT partition, and rows on their way would be missed; try again once the partition maintenance has made it', moving
            USING ERRCODE = 'object_in_use';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_redrive_refuse_during_move BEFORE INSERT ON outbox_redrive
    FOR EACH ROW EXECUTE FUNCTION outbox_redrive_refuse_during_move();

-- 00019's, but that in the outbox (sent_only) it takes outbox_redrive's
-- SHARE lock before it looks at the relay's position.
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
    IF sent_only THEN
        LOCK TABLE outbox_redrive IN SHARE MODE;
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

-- +goose Down
DROP TRIGGER outbox_redrive_refuse_during_move ON outbox_redrive;
DROP FUNCTION outbox_redrive_refuse_during_move();

-- 00019's partition_move_batch.
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

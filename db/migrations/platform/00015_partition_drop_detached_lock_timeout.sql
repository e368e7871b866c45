-- partition_drop_detached waited for its locks without limit: a leftover
-- detached table that a session held (a long reader that had opened it
-- before its detach, a backup) stalled every round of the maintenance at
-- its first step, so no partition was made either. Now each DROP waits at
-- most lock_timeout; a table it could not lock is kept (counted in
-- locked) and dropped at a later round, and the round goes on.
--
-- The one-argument form, which the release before calls, stays, and waits
-- as it did (the session's lock_timeout), so a rolling deploy keeps both
-- releases' rounds going.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION partition_drop_detached(parent text, lock_timeout text, OUT dropped integer, OUT locked integer)
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop_detached(parent text)
RETURNS integer LANGUAGE sql AS $$
    SELECT d.dropped FROM partition_drop_detached(parent, current_setting('lock_timeout')) d
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION partition_drop_detached(parent text)
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
DROP FUNCTION partition_drop_detached(text, text);

-- The sleep lock's key (see 00002) was written twice, in the trigger and in
-- the relay's Go, and the two had to agree. It is written once now, here:
-- the trigger and the relay's TakeSleepLock and ReleaseSleepLock (in
-- db/queries/outbox) call outbox_sleep_lock_key.

-- +goose Up
-- +goose StatementBegin
-- 0x6f7574626f785f77, "outbox_w" in ASCII.
CREATE FUNCTION outbox_sleep_lock_key() RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 8031453476610924407::bigint
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(outbox_sleep_lock_key()) THEN
        PERFORM pg_notify('onceflow_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(8031453476610924407) THEN
        PERFORM pg_notify('onceflow_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP FUNCTION outbox_sleep_lock_key();

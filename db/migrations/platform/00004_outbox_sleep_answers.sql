-- +goose Up
-- The relay's sleep lock no longer fails the claim queued behind it: the
-- relay asks for it with pg_try_advisory_lock and reads the answer
-- (TakeSleepLock in db/queries/outbox), so outbox_sleep is unused.
DROP FUNCTION outbox_sleep(bigint);

-- +goose Down
-- +goose StatementBegin
CREATE FUNCTION outbox_sleep(key bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_lock(key) THEN
        RAISE EXCEPTION 'outbox commits in progress hold the sleep lock' USING ERRCODE = 'lock_not_available';
    END IF;
END
$$;
-- +goose StatementEnd

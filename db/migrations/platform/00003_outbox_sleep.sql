-- +goose Up
-- A relay takes its sleep lock (see 00002) in the round trip of the claim
-- that must follow it, on the session that claims: the claim is queued
-- behind this call and runs only if the lock was had. While commits in
-- progress hold the lock shared it cannot be had, and the call fails with
-- lock_not_available, which also skips the claim.
-- +goose StatementBegin
CREATE FUNCTION outbox_sleep(key bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_lock(key) THEN
        RAISE EXCEPTION 'outbox commits in progress hold the sleep lock' USING ERRCODE = 'lock_not_available';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION outbox_sleep(bigint);

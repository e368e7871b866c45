-- +goose Up
-- A committing transaction that has notified takes a lock that every other
-- notifying commit of the cluster waits for, and each notification is read
-- by every listening session of the cluster. Under load, a notification per
-- producing commit serialises the producers' commits for a relay that is
-- busy anyway. So a commit notifies only when the relay sleeps.
--
-- A relay about to sleep takes the advisory lock 0x6f7574626f785f77
-- ("outbox_w") exclusively on its LISTEN session (see internal/outbox).
-- The trigger takes it shared until the commit: while it is held, the relay
-- cannot go to sleep, and once the relay has it, it publishes what was
-- committed before sleeping. When the relay holds it (sleeps, or is about
-- to), the shared lock cannot be had and the commit notifies.
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('onceflow_outbox', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

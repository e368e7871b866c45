-- Tables every service database gets: the consumer inbox, the transactional
-- outbox and the HTTP idempotency keys.

-- +goose Up
CREATE TABLE processed_events (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    -- The event's own time: the retention guard compares it with the
    -- retention period (an event older than it may have lost its row here).
    event_time   timestamptz NOT NULL,
    -- Where the first successful delivery came from, for diagnosis.
    stream_seq   bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- The retention cleaner deletes by age.
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

CREATE TABLE outbox (
    -- Publication order: the relay publishes unsent rows in id order.
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     uuid        NOT NULL UNIQUE,
    event_type   text        NOT NULL,
    source       text        NOT NULL,
    -- CloudEvents subject: the aggregate (e.g. the order id).
    subject      text        NOT NULL,
    nats_subject text        NOT NULL,
    event_time   timestamptz NOT NULL,
    data         jsonb       NOT NULL,
    traceparent  text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL until a publish ack came back; sent rows are kept for the re-drive
    -- window and then deleted by the cleaner.
    sent_at      timestamptz
);

CREATE INDEX outbox_unsent_idx ON outbox (id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_at_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;

-- Wake the relay when rows are committed. One notification per statement,
-- and PostgreSQL folds identical notifications of one transaction into one.
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('onceflow_outbox', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

CREATE TABLE idempotency_keys (
    -- What the key is scoped to, e.g. "POST /orders".
    scope            text        NOT NULL,
    key              text        NOT NULL,
    -- SHA-256 of the request (method, path, body): the same key with another
    -- request is refused.
    fingerprint      bytea       NOT NULL,
    -- NULL while the first request is in flight.
    status_code      integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
DROP TABLE outbox;
DROP TABLE processed_events;

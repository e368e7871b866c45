-- +goose Up
-- The loyalty service's own tables, in its own database (onceflow_loyalty),
-- beside the platform's inbox, outbox and idempotency keys.
--
-- customer_events is a starter: how many events the service handled per
-- customer. It is deliberately not idempotent by itself (a duplicate would
-- count twice), so the service's tests prove that the inbox is what makes
-- each event's effect happen once. Replace it with the service's real state
-- in a new migration (00002_….sql): a migration that has run is never edited.
CREATE TABLE customer_events (
    customer_id   text        PRIMARY KEY,
    events        bigint      NOT NULL CHECK (events > 0),
    last_event_id uuid        NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE customer_events;

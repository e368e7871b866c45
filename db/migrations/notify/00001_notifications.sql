-- +goose Up
-- The mailer's outbox: one e-mail per (order, milestone), written in the
-- same transaction as the inbox row of the event that caused it.
CREATE TABLE notifications (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL,
    kind       text        NOT NULL,
    recipient  text        NOT NULL,
    event_id   uuid        NOT NULL UNIQUE,
    -- Derived from the event id, so a resend after a crash is recognisable.
    message_id text        NOT NULL,
    subject    text        NOT NULL,
    body       text        NOT NULL,
    status     text        NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'SENT', 'FAILED')),
    attempts   integer     NOT NULL DEFAULT 0,
    last_error text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz,
    UNIQUE (order_id, kind)
);

CREATE INDEX notifications_pending_idx ON notifications (id) WHERE status = 'PENDING';

-- +goose Down
DROP TABLE notifications;

-- +goose Up
-- The mailer's outbox: one e-mail per (order, milestone), written in the
-- same transaction as the inbox row of the event that caused it, and sent by
-- the mailer afterwards.
CREATE TABLE notifications (
    -- Sending order: the mailer claims due rows in id order.
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id        uuid        NOT NULL,
    kind            text        NOT NULL
        CHECK (kind IN ('placed', 'confirmed', 'rejected', 'cancelled')),
    recipient       text        NOT NULL,
    -- The event that caused the e-mail: a second delivery of it finds this
    -- row even past the inbox's retention.
    event_id        uuid        NOT NULL UNIQUE,
    -- Derived from the event id, so a resend after a crash is recognisable.
    message_id      text        NOT NULL,
    subject         text        NOT NULL,
    body            text        NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'SENT', 'FAILED')),
    -- Sending attempts so far, the successful one included.
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      text        NOT NULL DEFAULT '',
    -- A PENDING row is not tried again before this (the retry backoff).
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    CHECK ((status = 'SENT') = (sent_at IS NOT NULL)),
    -- The audited invariant: exactly one e-mail per (order, milestone).
    UNIQUE (order_id, kind)
);

CREATE INDEX notifications_pending_idx ON notifications (id) WHERE status = 'PENDING';

-- +goose Down
DROP TABLE notifications;

-- +goose Up
CREATE TABLE wallets (
    customer_id   text        PRIMARY KEY,
    balance_cents bigint      NOT NULL DEFAULT 0 CHECK (balance_cents >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Every credit, so that money can be audited: balances + debits - refunds = credits.
CREATE TABLE wallet_credits (
    id           uuid        PRIMARY KEY,
    customer_id  text        NOT NULL REFERENCES wallets (customer_id),
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One payment per order: the primary key is what makes a second debit impossible.
CREATE TABLE payments (
    order_id       uuid        PRIMARY KEY,
    customer_id    text        NOT NULL,
    amount_cents   bigint      NOT NULL CHECK (amount_cents >= 0),
    status         text        NOT NULL CHECK (status IN ('DEBITED', 'REJECTED', 'REFUNDED')),
    reason         text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    refunded_at    timestamptz,
    CHECK ((status = 'REFUNDED') = (refunded_at IS NOT NULL))
);

-- +goose Down
DROP TABLE payments;
DROP TABLE wallet_credits;
DROP TABLE wallets;

-- The effect of the kit's test handlers: one row per order, deliberately
-- without a unique key, so that only the inbox keeps it to one; the
-- wallets an order debits, which events of one customer share; and a
-- tally that only a broken handler bumps.
-- +goose Up
CREATE TABLE effects (
    order_id uuid NOT NULL,
    event_id uuid NOT NULL
);

CREATE TABLE wallets (
    customer_id text PRIMARY KEY,
    balance_cents bigint NOT NULL
);

CREATE TABLE tally (
    name text PRIMARY KEY,
    n bigint NOT NULL
);

-- +goose Down
DROP TABLE tally;
DROP TABLE wallets;
DROP TABLE effects;

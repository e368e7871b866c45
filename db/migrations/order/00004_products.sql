-- +goose Up
-- The catalog: the price of every SKU an order may have. POST /orders
-- prices its lines from it, in the order's transaction, and stores each
-- unit price on its line: the price at the time of the order.
CREATE TABLE products (
    sku              text        PRIMARY KEY,
    name             text        NOT NULL DEFAULT '',
    unit_price_cents bigint      NOT NULL CHECK (unit_price_cents > 0),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE products;

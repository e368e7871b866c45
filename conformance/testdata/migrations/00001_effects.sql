-- The effect of the kit's test handlers: one row per order, deliberately
-- without a unique key, so that only the inbox keeps it to one.
-- +goose Up
CREATE TABLE effects (
    order_id uuid NOT NULL,
    event_id uuid NOT NULL
);

-- +goose Down
DROP TABLE effects;

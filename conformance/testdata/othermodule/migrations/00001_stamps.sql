-- +goose Up
CREATE TABLE stamps (
    order_id    uuid NOT NULL,
    customer_id text NOT NULL
);

-- +goose Down
DROP TABLE stamps;

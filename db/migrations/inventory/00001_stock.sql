-- +goose Up
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    available  bigint      NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One decision per order: all lines reserved, or none.
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    status     text        NOT NULL CHECK (status IN ('RESERVED', 'REJECTED')),
    reason     text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reservation_lines (
    order_id uuid    NOT NULL REFERENCES reservations (order_id),
    sku      text    NOT NULL,
    quantity integer NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);

-- +goose Down
DROP TABLE reservation_lines;
DROP TABLE reservations;
DROP TABLE stock;

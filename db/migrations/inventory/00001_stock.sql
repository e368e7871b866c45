-- +goose Up
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    available  bigint      NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One decision per order: all lines reserved, or none. The primary key is
-- what makes a second decision impossible, whatever events arrive.
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    status     text        NOT NULL CHECK (status IN ('RESERVED', 'REJECTED')),
    reason     text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    -- A rejection always says why (naming the SKU); a reservation never does.
    CHECK ((status = 'REJECTED') = (reason <> ''))
);

-- The quantities a RESERVED order took, summed per SKU (an order may repeat
-- a SKU over several lines, hence bigint).
CREATE TABLE reservation_lines (
    order_id uuid   NOT NULL REFERENCES reservations (order_id),
    sku      text   NOT NULL,
    quantity bigint NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);

-- +goose Down
DROP TABLE reservation_lines;
DROP TABLE reservations;
DROP TABLE stock;

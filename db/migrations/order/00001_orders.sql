-- +goose Up
CREATE TABLE orders (
    id             uuid        PRIMARY KEY, -- UUIDv7: time-ordered
    customer_id    text        NOT NULL,
    customer_email text        NOT NULL DEFAULT '',
    status         text        NOT NULL
        CHECK (status IN ('PENDING', 'PAID', 'CONFIRMED', 'REJECTED', 'CANCELLED')),
    total_cents    bigint      NOT NULL CHECK (total_cents >= 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- GET /orders?customer_id=…, newest first (id breaks ties of one transaction time).
CREATE INDEX orders_customer_id_idx ON orders (customer_id, created_at, id);

CREATE TABLE order_lines (
    order_id         uuid    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line_no          integer NOT NULL,
    sku              text    NOT NULL,
    quantity         integer NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint  NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line_no),
    -- One line per SKU, so that inventory reserves each SKU once.
    UNIQUE (order_id, sku)
);

-- Every saga event that touched the order, once: the events it emitted and
-- the events it consumed, whether or not they changed its status.
CREATE TABLE order_timeline (
    order_id   uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    event_id   uuid        NOT NULL,
    event_type text        NOT NULL,
    -- The event's own time (CloudEvents "time"), not when it was processed.
    at         timestamptz NOT NULL,
    -- Why, for the events that carry a reason (rejections, cancellations):
    -- an OrderCancelled takes its reason from the StockRejected seen here.
    reason     text        NOT NULL DEFAULT '',
    PRIMARY KEY (order_id, event_id)
);

-- +goose Down
DROP TABLE order_timeline;
DROP TABLE order_lines;
DROP TABLE orders;

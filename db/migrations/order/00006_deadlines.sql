-- +goose Up
-- Every saga ends: an order carries the deadline it was placed with, and the
-- order service expires one still open past it (services/order/expirer.go).
-- Orders placed before have none and are never expired.
ALTER TABLE orders ADD COLUMN deadline timestamptz;

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('PENDING', 'PAID', 'CONFIRMED', 'REJECTED', 'CANCELLED', 'EXPIRED'));

-- The open orders by deadline: the expirer reads the due ones from its
-- start and never scans the terminal orders, however many there are.
CREATE INDEX orders_deadline_idx ON orders (deadline) WHERE status IN ('PENDING', 'PAID');

-- The fate of a reply that arrived once its order was terminal (docs/saga.md):
-- 'refunded' (a debit after expiry, which payment refunds), 'released' (a
-- reservation after expiry, which inventory releases) or 'unchanged'; empty
-- for every other entry.
ALTER TABLE order_timeline ADD COLUMN late text NOT NULL DEFAULT ''
    CHECK (late IN ('', 'refunded', 'released', 'unchanged'));

-- order_views gains the deadline, and each timeline entry its reason and
-- fate when late.
CREATE OR REPLACE VIEW order_views AS
SELECT
    o.id, o.customer_id, o.customer_email, o.status, o.total_cents, o.created_at, o.updated_at,
    coalesce((
        SELECT json_agg(json_build_object('sku', l.sku, 'quantity', l.quantity, 'unit_price_cents', l.unit_price_cents)
                        ORDER BY l.line_no)
        FROM order_lines l
        WHERE l.order_id = o.id
    ), '[]'::json)::json AS items,
    coalesce((
        SELECT json_agg(json_build_object('type', t.event_type, 'event_id', t.event_id, 'at', t.at,
                                          'reason', t.reason, 'late', t.late)
                        ORDER BY t.at, t.event_id)
        FROM order_timeline t
        WHERE t.order_id = o.id
    ), '[]'::json)::json AS timeline,
    o.deadline
FROM orders o;

-- +goose Down
-- CREATE OR REPLACE VIEW cannot drop a column.
DROP VIEW order_views;
CREATE VIEW order_views AS
SELECT
    o.id, o.customer_id, o.customer_email, o.status, o.total_cents, o.created_at, o.updated_at,
    coalesce((
        SELECT json_agg(json_build_object('sku', l.sku, 'quantity', l.quantity, 'unit_price_cents', l.unit_price_cents)
                        ORDER BY l.line_no)
        FROM order_lines l
        WHERE l.order_id = o.id
    ), '[]'::json)::json AS items,
    coalesce((
        SELECT json_agg(json_build_object('type', t.event_type, 'event_id', t.event_id, 'at', t.at)
                        ORDER BY t.at, t.event_id)
        FROM order_timeline t
        WHERE t.order_id = o.id
    ), '[]'::json)::json AS timeline
FROM orders o;
ALTER TABLE order_timeline DROP COLUMN late;
DROP INDEX orders_deadline_idx;
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('PENDING', 'PAID', 'CONFIRMED', 'REJECTED', 'CANCELLED'));
ALTER TABLE orders DROP COLUMN deadline;

-- name: ListOrders :many
SELECT id, customer_id, status, total_cents, deadline
FROM orders
ORDER BY id;

-- name: ListOrderLines :many
-- One row per (order, SKU): order_lines is unique on it.
SELECT order_id, sku, quantity
FROM order_lines
ORDER BY order_id, sku;

-- name: CountUnfinishedOrders :one
-- Orders not yet in a terminal state; the auditor waits for none.
SELECT count(*)
FROM orders
WHERE status NOT IN ('CONFIRMED', 'REJECTED', 'CANCELLED', 'EXPIRED');

-- name: ListLateReplies :many
-- The replies that found their order terminal, with their fates.
SELECT order_id, event_id, event_type, late
FROM order_timeline
WHERE late <> ''
ORDER BY order_id, event_id;

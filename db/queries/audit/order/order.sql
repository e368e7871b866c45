-- name: ListOrders :many
SELECT id, customer_id, status, total_cents
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

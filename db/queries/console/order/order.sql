-- Read by the operator's console (internal/console) from the order
-- database.

-- name: ListOrders :many
-- A page of orders, newest first (ids are UUIDv7: time-ordered), before
-- the cursor @before (the nil UUID for the first page), of one customer
-- and one status when given ('' for any).
SELECT id, customer_id, status, total_cents, created_at, updated_at
FROM orders
WHERE (@before::uuid = '00000000-0000-0000-0000-000000000000' OR id < @before::uuid)
  AND (@customer_id::text = '' OR customer_id = @customer_id::text)
  AND (@status::text = '' OR status = @status::text)
ORDER BY id DESC
LIMIT @max_rows;

-- name: GetOrder :one
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at
FROM orders
WHERE id = @id;

-- name: OrderLines :many
SELECT sku, quantity, unit_price_cents
FROM order_lines
WHERE order_id = @order_id
ORDER BY line_no;

-- name: OrderTimeline :many
-- The order's events, its own and those it consumed, with their own times,
-- and a reply's fate when it came after the order was terminal.
SELECT event_id, event_type, at, reason, late
FROM order_timeline
WHERE order_id = @order_id
ORDER BY at, event_id;

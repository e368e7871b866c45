-- name: InsertOrderWithLines :exec
-- Writes a new order, its lines and the OrderPlaced entry of its timeline in
-- one statement; the line arrays are parallel. The order is created at its
-- OrderPlaced event's time, so that POST /orders can answer without reading
-- the row back and the statement can go with the COMMIT. Its deadline is
-- stored with it: past it, the expirer ends the order if the saga has not.
WITH new_order AS (
    INSERT INTO orders (id, customer_id, customer_email, status, total_cents, created_at, updated_at, deadline)
    VALUES (@id, @customer_id, @customer_email, 'PENDING', @total_cents, @placed_at, @placed_at, @deadline)
), new_lines AS (
    INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
    SELECT @id,
        unnest(@line_nos::integer[]),
        unnest(@skus::text[]),
        unnest(@quantities::integer[]),
        unnest(@unit_prices_cents::bigint[])
)
INSERT INTO order_timeline (order_id, event_id, event_type, at)
VALUES (@id, @placed_event_id, @placed_event_type, @placed_at);

-- name: GetOrderView :one
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at, items, timeline, deadline
FROM order_views
WHERE id = @id;

-- name: LockOrder :one
-- The order, locked for the rest of the transaction: the saga's events for
-- one order are applied one at a time, and the events they cause enter the
-- outbox in that order.
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at, deadline
FROM orders
WHERE id = @id
FOR UPDATE;

-- name: SetOrderStatus :exec
UPDATE orders
SET status = @status, updated_at = now()
WHERE id = @id;

-- name: ListCustomerOrderViews :many
-- A customer's orders, newest first, from the first one older than the
-- cursor (@before_created_at, @before_id): a keyset page, which reads the
-- customer's index from the cursor on however deep the page.
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at, items, timeline, deadline
FROM order_views
WHERE customer_id = @customer_id
  AND (created_at, id) < (@before_created_at::timestamptz, @before_id::uuid)
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: LockOrders :many
-- The orders among ids, locked in id order: a batch that touches several
-- orders takes their locks in the same order as any other batch, so that
-- the two subscriptions' batches cannot deadlock each other. (When a batch
-- fails, the inbox runs its events one per transaction: one order's lock
-- each, which cannot deadlock with a batch either.)
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at, deadline
FROM orders
WHERE id = ANY (@ids::uuid[])
ORDER BY id
FOR UPDATE;

-- name: SetOrderStatuses :exec
-- Sets the status of ids[i] to statuses[i], as SetOrderStatus does for one
-- order; the caller locked the orders. The ids are named twice: = ANY is an
-- index condition even in a generic plan made on a nearly empty table,
-- where a join on the key alone is a sequential scan (db/plans_test.go).
UPDATE orders
SET status = u.status, updated_at = now()
FROM (SELECT unnest(@ids::uuid[]) AS id, unnest(@statuses::text[]) AS status) AS u
WHERE orders.id = u.id AND orders.id = ANY (@ids::uuid[]);

-- name: CountOrdersInFlight :one
-- The orders not yet in a terminal state (orders_in_flight_idx).
SELECT count(*) FROM orders
WHERE status IN ('PENDING', 'PAID');

-- name: ClaimDueOrders :many
-- Up to max_rows open orders whose deadline has passed, soonest first,
-- locked for the rest of the transaction (orders_deadline_idx). Orders that
-- another transaction holds are skipped, not waited for: an event handler
-- applying a reply, or another replica's expirer; the next round sees them
-- again if they are still open.
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at, deadline
FROM orders
WHERE status IN ('PENDING', 'PAID') AND deadline <= @now::timestamptz
ORDER BY deadline
LIMIT @max_rows
FOR UPDATE SKIP LOCKED;

-- name: NextDeadline :one
-- The earliest deadline of an open order; no row when none has one.
SELECT deadline
FROM orders
WHERE status IN ('PENDING', 'PAID') AND deadline IS NOT NULL
ORDER BY deadline
LIMIT 1;

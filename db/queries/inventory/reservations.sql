-- name: InsertReservation :execrows
-- Records the order's decision, unless one is recorded already: no row
-- affected means another event for the order decided first. A concurrent
-- insert for the same order waits for the first transaction and then sees
-- the conflict.
INSERT INTO reservations (order_id, status, reason)
VALUES (@order_id, @status, @reason)
ON CONFLICT (order_id) DO NOTHING;

-- name: InsertReservationLines :exec
INSERT INTO reservation_lines (order_id, sku, quantity)
SELECT @order_id::uuid, unnest(@skus::text[]), unnest(@quantities::bigint[]);

-- name: InsertReservations :exec
-- Records several decisions with one statement. An order decided already is
-- a unique violation: the caller falls back to InsertReservation, which
-- leaves the first decision standing.
INSERT INTO reservations (order_id, status, reason)
SELECT unnest(@order_ids::uuid[]), unnest(@statuses::text[]), unnest(@reasons::text[]);

-- name: InsertReservationLinesOfOrders :exec
-- Records the lines of several orders: order_ids[i] took quantities[i] of
-- skus[i].
INSERT INTO reservation_lines (order_id, sku, quantity)
SELECT unnest(@order_ids::uuid[]), unnest(@skus::text[]), unnest(@quantities::bigint[]);

-- name: LockReservation :one
-- The order's decision, locked for the rest of the transaction.
SELECT order_id, status
FROM reservations
WHERE order_id = @order_id
FOR UPDATE;

-- name: ReservationLines :many
-- What a reservation holds, in SKU order: the order its stock rows are
-- locked in.
SELECT sku, quantity
FROM reservation_lines
WHERE order_id = @order_id
ORDER BY sku;

-- name: MarkReleased :exec
UPDATE reservations
SET status = 'RELEASED', released_at = now()
WHERE order_id = @order_id AND status = 'RESERVED';

-- name: ReservedSkus :many
-- The SKUs the reservations of order_ids hold, in SKU order.
SELECT DISTINCT sku
FROM reservation_lines
WHERE order_id = ANY (@order_ids::uuid[])
ORDER BY sku;

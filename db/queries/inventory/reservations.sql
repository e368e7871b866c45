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

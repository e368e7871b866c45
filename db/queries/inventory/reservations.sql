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

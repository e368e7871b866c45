-- name: ListStock :many
SELECT sku, available
FROM stock
ORDER BY sku;

-- name: ListReservations :many
SELECT order_id, status
FROM reservations
ORDER BY order_id;

-- name: ListReservationLines :many
SELECT order_id, sku, quantity
FROM reservation_lines
ORDER BY order_id, sku;

-- name: ListStock :many
-- Each SKU's level and what its ledger adds up to: every receipt,
-- adjustment and count (stock_movements has a foreign key to stock).
SELECT s.sku, s.available, coalesce(m.ledger, 0)::bigint AS ledger
FROM stock AS s
LEFT JOIN (SELECT sku, sum(delta) AS ledger FROM stock_movements GROUP BY sku) AS m USING (sku)
ORDER BY s.sku;

-- name: ListReservations :many
SELECT order_id, status
FROM reservations
ORDER BY order_id;

-- name: ListReservationLines :many
SELECT order_id, sku, quantity
FROM reservation_lines
ORDER BY order_id, sku;

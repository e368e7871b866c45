-- name: GetStock :one
SELECT sku, available, updated_at
FROM stock
WHERE sku = @sku;

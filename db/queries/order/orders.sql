-- name: GetOrder :one
SELECT id, customer_id, customer_email, status, total_cents, created_at, updated_at
FROM orders
WHERE id = @id;

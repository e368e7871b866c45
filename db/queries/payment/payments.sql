-- name: LockPayment :one
-- The payment of an order, locked for the rest of the transaction.
SELECT order_id, customer_id, amount_cents, status
FROM payments
WHERE order_id = @order_id
FOR UPDATE;

-- name: InsertPayment :exec
INSERT INTO payments (order_id, customer_id, amount_cents, status, reason)
VALUES (@order_id, @customer_id, @amount_cents, @status, @reason);

-- name: MarkRefunded :exec
UPDATE payments
SET status = 'REFUNDED', refunded_at = now()
WHERE order_id = @order_id AND status = 'DEBITED';

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
-- Refunds a debited payment; reason says why when it is not a stock
-- refusal (an expired order's).
UPDATE payments
SET status = 'REFUNDED', refunded_at = now(), reason = @reason
WHERE order_id = @order_id AND status = 'DEBITED';

-- name: InsertPayments :exec
-- Records several payments with one statement. An order that has one
-- already is a unique violation, as with InsertPayment.
INSERT INTO payments (order_id, customer_id, amount_cents, status, reason)
SELECT
    unnest(@order_ids::uuid[]),
    unnest(@customer_ids::text[]),
    unnest(@amounts::bigint[]),
    unnest(@statuses::text[]),
    unnest(@reasons::text[]);

-- name: PaymentCustomers :many
-- The customers whose payments are among order_ids, in key order.
SELECT DISTINCT customer_id
FROM payments
WHERE order_id = ANY (@order_ids::uuid[])
ORDER BY customer_id;

-- name: ListPayments :many
SELECT order_id, customer_id, amount_cents, status
FROM payments
ORDER BY order_id;

-- name: ListWallets :many
-- Each wallet's balance and the sum of every credit it received.
SELECT
    w.customer_id,
    w.balance_cents,
    coalesce(c.credited_cents, 0)::bigint AS credited_cents
FROM wallets w
LEFT JOIN (
    SELECT customer_id, sum(amount_cents) AS credited_cents
    FROM wallet_credits
    GROUP BY customer_id
) c USING (customer_id)
ORDER BY w.customer_id;

-- name: GetWallet :one
SELECT customer_id, balance_cents
FROM wallets
WHERE customer_id = @customer_id;

-- name: CreditWallet :one
INSERT INTO wallets (customer_id, balance_cents)
VALUES (@customer_id, @amount_cents)
ON CONFLICT (customer_id) DO UPDATE
SET balance_cents = wallets.balance_cents + excluded.balance_cents, updated_at = now()
RETURNING customer_id, balance_cents;

-- name: RecordCredit :exec
INSERT INTO wallet_credits (id, customer_id, amount_cents)
VALUES (@id, @customer_id, @amount_cents);

-- name: DebitWallet :one
-- Takes the amount only if the balance covers it; no row back means it does
-- not (or the wallet was never credited).
UPDATE wallets
SET balance_cents = balance_cents - @amount_cents, updated_at = now()
WHERE customer_id = @customer_id AND balance_cents >= @amount_cents
RETURNING balance_cents;

-- name: RefundWallet :exec
UPDATE wallets
SET balance_cents = balance_cents + @amount_cents, updated_at = now()
WHERE customer_id = @customer_id;

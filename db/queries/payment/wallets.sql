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

-- name: LockWallets :many
-- The wallets of customer_ids that exist, locked in key order: two batches
-- over overlapping wallets take their locks in the same order and cannot
-- deadlock. (The lock step runs after the sort.)
SELECT customer_id, balance_cents
FROM wallets
WHERE customer_id = ANY (@customer_ids::text[])
ORDER BY customer_id
FOR UPDATE;

-- name: DebitWallets :exec
-- Takes amounts[i] from customer_ids[i]. The caller locked the wallets and
-- checked that their balances cover the amounts; were it not so, the
-- balance's CHECK fails the statement on the server, and with it a COMMIT
-- sent in the same round trip (a row count compared by the client would
-- come after that COMMIT).
-- The customer_ids are named twice: = ANY is an index condition even in a
-- generic plan made on a nearly empty table (db/plans_test.go).
UPDATE wallets
SET balance_cents = wallets.balance_cents - d.amount, updated_at = now()
FROM (SELECT unnest(@customer_ids::text[]) AS customer_id, unnest(@amounts::bigint[]) AS amount) AS d
WHERE wallets.customer_id = d.customer_id AND wallets.customer_id = ANY (@customer_ids::text[]);

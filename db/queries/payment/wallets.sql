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

-- name: ReadWallets :many
-- The wallets of customer_ids that exist, not locked: a set-based batch
-- decides on the balances it read and then debits them with
-- DebitWalletsAsRead, which fails unless the decisions still hold.
SELECT customer_id, balance_cents
FROM wallets
WHERE customer_id = ANY (@customer_ids::text[])
ORDER BY customer_id;

-- name: LockWalletsForDebit :exec
-- LockWallets for a pipeline, ahead of DebitWalletsAsRead: the debit's own
-- plan (a hash join over a scan, for a small table) would lock the rows in
-- the order it finds them, and two batches could then deadlock.
SELECT 1
FROM wallets
WHERE customer_id = ANY (@customer_ids::text[])
ORDER BY customer_id
FOR UPDATE;

-- name: DebitWalletsAsRead :exec
-- Takes amounts[i] from customer_ids[i], each only if the balance still
-- covers it and has not grown since it was read as seen[i]. Then every
-- decision made on the balances as read holds on the balances as they are:
-- a balance that only shrank rejects whatever it rejected before, and the
-- orders it paid are covered. The caller passes every wallet it read
-- (amount 0 for those it only decided on), locked in key order first
-- (LockWalletsForDebit). If one of them changed otherwise, it fails
-- (expect_rows) and so does the transaction, even when its COMMIT was sent
-- with it.
WITH debited AS (
    UPDATE wallets
    SET balance_cents = wallets.balance_cents - d.amount, updated_at = now()
    FROM (
        SELECT unnest(@customer_ids::text[]) AS customer_id, unnest(@amounts::bigint[]) AS amount, unnest(@seen::bigint[]) AS seen
    ) AS d
    WHERE wallets.customer_id = d.customer_id
      AND wallets.balance_cents >= d.amount
      AND wallets.balance_cents <= d.seen
    RETURNING wallets.customer_id
)
SELECT expect_rows((SELECT count(*) FROM debited), cardinality(@customer_ids::text[]), 'DebitWalletsAsRead: balances changed since they were read');

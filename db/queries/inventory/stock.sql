-- name: GetStock :one
SELECT sku, available, updated_at
FROM stock
WHERE sku = @sku;

-- name: SetStock :one
-- Sets the absolute level of a SKU, creating it if it is new.
INSERT INTO stock (sku, available)
VALUES (@sku, @available)
ON CONFLICT (sku) DO UPDATE
SET available = excluded.available, updated_at = now()
RETURNING sku, available;

-- name: LockStock :many
-- The stock rows of skus that exist, locked in SKU order: two orders over
-- overlapping SKUs then take their locks in the same order and cannot
-- deadlock. (The lock step runs after the sort, so rows are locked in the
-- order they are returned.)
SELECT sku, available
FROM stock
WHERE sku = ANY (@skus::text[])
ORDER BY sku
FOR UPDATE;

-- name: DecrementStock :execrows
-- Takes quantities[i] from skus[i], each only if it is available; the caller
-- compares the rows affected with len(skus).
UPDATE stock
SET available = stock.available - want.quantity, updated_at = now()
FROM (SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity) AS want
WHERE stock.sku = want.sku AND stock.available >= want.quantity;

-- name: ReadStock :many
-- The stock rows of skus that exist, in SKU order, not locked: a set-based
-- batch decides on what it read and then takes the stock with TakeStock,
-- which fails unless the decisions still hold. Other batches meanwhile
-- wait only for the batch's writes and commit, not for its decisions.
SELECT sku, available
FROM stock
WHERE sku = ANY (@skus::text[])
ORDER BY sku;

-- name: LockStockForTaking :exec
-- LockStock for a pipeline, ahead of TakeStock: the update's own plan (a
-- hash join over a scan, for a small table) would lock the rows in the
-- order it finds them, and two batches could then deadlock.
SELECT 1
FROM stock
WHERE sku = ANY (@skus::text[])
ORDER BY sku
FOR UPDATE;

-- name: TakeStock :exec
-- Takes quantities[i] from skus[i], each only if the stock still covers it
-- and has not grown since it was read as seen[i]. Then every decision made
-- on the stock as read holds on the stock as it is: stock that only
-- shrank rejects whatever it rejected before, and an order it reserved is
-- covered. The caller passes every SKU it read (quantity 0 for those it
-- only decided on), locked in SKU order first (LockStockForTaking). If one
-- of them changed otherwise, it fails (expect_rows) and so does the
-- transaction, even when its COMMIT was sent with it.
WITH taken AS (
    UPDATE stock
    SET available = stock.available - want.quantity, updated_at = now()
    FROM (
        SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity, unnest(@seen::bigint[]) AS seen
    ) AS want
    WHERE stock.sku = want.sku
      AND stock.available >= want.quantity
      AND stock.available <= want.seen
    RETURNING stock.sku
)
SELECT expect_rows((SELECT count(*) FROM taken), cardinality(@skus::text[]), 'TakeStock: stock changed since it was read');

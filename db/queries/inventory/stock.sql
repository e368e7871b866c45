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

-- name: DecrementStock :exec
-- Takes quantities[i] from skus[i], each only if it is available. The
-- caller locked the rows and checked the stock, so every SKU is taken; if
-- one is not, the schema or the locking is broken, and the statement fails
-- on the server (expect_rows), so that a COMMIT sent with it in one round
-- trip commits nothing.
WITH taken AS (
    UPDATE stock
    SET available = stock.available - want.quantity, updated_at = now()
    FROM (SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity) AS want
    WHERE stock.sku = want.sku AND stock.available >= want.quantity
    RETURNING stock.sku
)
SELECT expect_rows((SELECT count(*) FROM taken), cardinality(@skus::text[]), 'DecrementStock');

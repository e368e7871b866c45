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
-- Takes quantities[i] from skus[i]. The caller locked the rows and checked
-- that the stock covers the quantities; were it not so, the stock's CHECK
-- fails the statement on the server, and with it a COMMIT sent in the same
-- round trip (a row count compared by the client would come after that
-- COMMIT).
-- The skus are named twice: = ANY is an index condition even in a
-- generic plan made on a nearly empty table (db/plans_test.go).
UPDATE stock
SET available = stock.available - want.quantity, updated_at = now()
FROM (SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity) AS want
WHERE stock.sku = want.sku AND stock.sku = ANY (@skus::text[]);

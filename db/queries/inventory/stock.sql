-- name: GetStock :one
SELECT sku, available, version
FROM stock
WHERE sku = @sku;

-- name: ReceiveStock :one
-- Adds quantity to a SKU's level, creating the SKU if it is new, unless the
-- level would pass max_available: then no row comes back.
INSERT INTO stock (sku, available)
VALUES (@sku, @quantity)
ON CONFLICT (sku) DO UPDATE
SET available = stock.available + excluded.available, version = stock.version + 1, updated_at = now()
WHERE stock.available + excluded.available <= @max_available
RETURNING sku, available, version;

-- name: LockStockItem :one
-- One SKU's stock row, locked until the transaction ends: an adjustment or
-- a count decides on the level it read.
SELECT sku, available, version
FROM stock
WHERE sku = @sku
FOR UPDATE;

-- name: SetStockLevel :one
-- Sets the level of a SKU the caller locked.
UPDATE stock
SET available = @available, version = version + 1, updated_at = now()
WHERE sku = @sku
RETURNING sku, available, version;

-- name: InsertStockMovement :exec
-- Records a change of a SKU's level that is not a reservation, in the
-- transaction of the change.
INSERT INTO stock_movements (sku, kind, delta, reason)
VALUES (@sku, @kind, @delta, @reason);

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
-- generic plan made on a nearly empty table (db/plans_test.go). writes[i]
-- is how many reservations take from skus[i] (one, but in a set-based
-- batch): the version counts each, as one reservation at a time would.
UPDATE stock
SET available = stock.available - want.quantity, version = stock.version + want.writes, updated_at = now()
FROM (SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity, unnest(@writes::bigint[]) AS writes) AS want
WHERE stock.sku = want.sku AND stock.sku = ANY (@skus::text[]);

-- name: IncrementStock :exec
-- Gives quantities[i] of skus[i] back: a released reservation's. The caller
-- locked the rows in SKU order (LockStock), as a reservation does.
UPDATE stock
SET available = stock.available + back.quantity, version = stock.version + 1, updated_at = now()
FROM (SELECT unnest(@skus::text[]) AS sku, unnest(@quantities::bigint[]) AS quantity) AS back
WHERE stock.sku = back.sku AND stock.sku = ANY (@skus::text[]);

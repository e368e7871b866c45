-- name: PutProduct :one
-- Sets a product's name and price, creating it if it is new: a PUT, the
-- same request twice sets the same values.
INSERT INTO products (sku, name, unit_price_cents)
VALUES (@sku, @name, @unit_price_cents)
ON CONFLICT (sku) DO UPDATE
SET name = excluded.name, unit_price_cents = excluded.unit_price_cents, updated_at = now()
RETURNING sku, name, unit_price_cents, updated_at;

-- name: GetProduct :one
SELECT sku, name, unit_price_cents, updated_at
FROM products
WHERE sku = @sku;

-- name: ListProducts :many
-- The products after the SKU @after, in SKU order: a keyset page.
SELECT sku, name, unit_price_cents, updated_at
FROM products
WHERE sku > @after
ORDER BY sku
LIMIT @max_rows;

-- name: PriceSKUs :many
-- The prices of the SKUs an order names, read in its transaction; a SKU
-- missing from the answer is not in the catalog.
SELECT sku, unit_price_cents
FROM products
WHERE sku = ANY (@skus::text[]);

-- name: CheckPrices :exec
-- Fails unless each SKU is in the catalog at the price beside it: the
-- check, in the order's transaction, of prices remembered from an earlier
-- read (see check_prices).
SELECT check_prices(@skus::text[], @prices::bigint[]);

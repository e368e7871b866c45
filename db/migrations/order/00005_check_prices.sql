-- +goose Up
-- check_prices fails unless each of skus is in the catalog at the price
-- beside it in prices: the check, in an order's transaction, of the prices
-- the order service priced it at from what it read of the catalog before
-- (services/order/catalog.go). A function because plain SQL cannot fail a
-- statement on a condition; it writes nothing.
-- +goose StatementBegin
CREATE FUNCTION check_prices(skus text[], prices bigint[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    stale text;
BEGIN
    SELECT l.sku INTO stale
    FROM unnest(skus, prices) AS l (sku, unit_price_cents)
    LEFT JOIN products p ON p.sku = l.sku
    WHERE p.unit_price_cents IS DISTINCT FROM l.unit_price_cents
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'sku % is not in the catalog at the price the order was given', stale;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION check_prices(text[], bigint[]);

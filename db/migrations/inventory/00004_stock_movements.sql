-- Stock is a ledger. Every change of a SKU's available level that is not a
-- reservation is a movement, written in the transaction that makes the
-- change: goods received, a signed adjustment with its reason, a stock count
-- that sets the level. So, per SKU, available + reserved = the sum of its
-- movements, which `onceflow audit` checks. The level alone could not say
-- whether a retried write had undone a reservation.
--
-- The version counts the writes of a row, reservations included: a stock
-- count names the version it counted (If-Match), and one that a reservation
-- overtook is refused instead of putting the reserved units back.
-- +goose Up
ALTER TABLE stock ADD COLUMN version bigint NOT NULL DEFAULT 1;

CREATE TABLE stock_movements (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sku        text        NOT NULL REFERENCES stock (sku),
    kind       text        NOT NULL CHECK (kind IN ('OPENING', 'RECEIPT', 'ADJUSTMENT', 'COUNT')),
    -- What the movement added to available (negative: took away).
    delta      bigint      NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (kind <> 'RECEIPT' OR delta > 0),
    -- An adjustment moves stock and says why.
    CHECK (kind <> 'ADJUSTMENT' OR (delta <> 0 AND reason <> ''))
);

CREATE INDEX stock_movements_sku_idx ON stock_movements (sku);

-- The stock of a database migrated with stock in it opens the ledger: what
-- is available and what is reserved of each SKU.
INSERT INTO stock_movements (sku, kind, delta, reason)
SELECT s.sku, 'OPENING', s.available + coalesce(r.quantity, 0), 'stock before the ledger'
FROM stock AS s
LEFT JOIN (SELECT sku, sum(quantity) AS quantity FROM reservation_lines GROUP BY sku) AS r USING (sku)
ORDER BY s.sku;

-- +goose Down
DROP TABLE stock_movements;
ALTER TABLE stock DROP COLUMN version;

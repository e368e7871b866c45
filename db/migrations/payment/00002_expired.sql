-- +goose Up
-- A payment is also EXPIRED: the order expired before payment handled its
-- OrderPlaced, and this row, written by the OrderExpired, is the decision
-- that it is never debited (an OrderPlaced that comes later finds it). An
-- order debited before its OrderExpired is REFUNDED instead, with reason
-- 'order expired' (docs/saga.md).
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('DEBITED', 'REJECTED', 'REFUNDED', 'EXPIRED'));

-- +goose Down
DELETE FROM payments WHERE status = 'EXPIRED';
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('DEBITED', 'REJECTED', 'REFUNDED'));

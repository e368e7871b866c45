-- +goose Up
-- The decisions an expired order adds (docs/saga.md): RELEASED, a
-- reservation whose stock was given back when its order expired (its lines
-- stay, as the record of what was held); EXPIRED, an order that expired
-- before inventory decided, written by the OrderExpired so that a
-- PaymentDebited that comes later reserves nothing.
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('RESERVED', 'REJECTED', 'RELEASED', 'EXPIRED'));
ALTER TABLE reservations ADD COLUMN released_at timestamptz;
ALTER TABLE reservations ADD CONSTRAINT reservations_released_check
    CHECK ((status = 'RELEASED') = (released_at IS NOT NULL));

-- +goose Down
ALTER TABLE reservations DROP CONSTRAINT reservations_released_check;
ALTER TABLE reservations DROP COLUMN released_at;
DELETE FROM reservations WHERE status = 'EXPIRED';
UPDATE reservations SET status = 'RESERVED' WHERE status = 'RELEASED';
ALTER TABLE reservations DROP CONSTRAINT reservations_status_check;
ALTER TABLE reservations ADD CONSTRAINT reservations_status_check
    CHECK (status IN ('RESERVED', 'REJECTED'));

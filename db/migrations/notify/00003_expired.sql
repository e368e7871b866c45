-- +goose Up
-- An expired order is a milestone too: one e-mail tells the customer that
-- the order was not completed in time and that nothing stays charged.
ALTER TABLE notifications DROP CONSTRAINT notifications_kind_check;
ALTER TABLE notifications ADD CONSTRAINT notifications_kind_check
    CHECK (kind IN ('placed', 'confirmed', 'rejected', 'cancelled', 'expired'));

-- +goose Down
DELETE FROM notifications WHERE kind = 'expired';
ALTER TABLE notifications DROP CONSTRAINT notifications_kind_check;
ALTER TABLE notifications ADD CONSTRAINT notifications_kind_check
    CHECK (kind IN ('placed', 'confirmed', 'rejected', 'cancelled'));

-- +goose Up
-- Whose notification a row is, so that GET /notifications shows a
-- customer only their own. Rows written before have none: only an operator
-- sees them.
ALTER TABLE notifications ADD COLUMN customer_id text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE notifications DROP COLUMN customer_id;

-- +goose Up
-- The orders the saga has not finished, counted by POST /orders to refuse
-- new orders while the saga is too far behind (MAX_ORDERS_IN_FLIGHT). It
-- costs the HOT updates of status: a price paid for a count that stays cheap
-- however many orders the table holds.
CREATE INDEX orders_in_flight_idx ON orders (id) WHERE status IN ('PENDING', 'PAID');

-- +goose Down
DROP INDEX orders_in_flight_idx;

-- name: CountEvent :exec
-- Counts one more handled event for the customer.
INSERT INTO customer_events (customer_id, events, last_event_id)
VALUES (@customer_id, 1, @event_id)
ON CONFLICT (customer_id) DO UPDATE
SET events = customer_events.events + 1, last_event_id = excluded.last_event_id, updated_at = now();

-- name: GetCustomerEvents :one
SELECT customer_id, events
FROM customer_events
WHERE customer_id = @customer_id;

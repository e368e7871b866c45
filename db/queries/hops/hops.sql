-- Read by bench/hops: the times a service's database keeps of the events it
-- published and the events it consumed.

-- name: PublishedEvents :many
SELECT o.event_id, o.subject, o.event_type, o.event_time, s.sent_at
FROM outbox o
JOIN outbox_sent s ON s.id = o.id AND s.created_at = o.created_at;

-- name: ConsumedEvents :many
-- processed_at is the start of the transaction that claimed the event.
SELECT event_id, processed_at
FROM processed_events;

-- Read by bench/hops: the times a service's database keeps of the events it
-- published and the events it consumed.

-- name: PublishedEvents :many
SELECT event_id, subject, event_type, event_time, sent_at
FROM outbox
WHERE sent_at IS NOT NULL;

-- name: ConsumedEvents :many
-- processed_at is the start of the transaction that claimed the event.
SELECT event_id, processed_at
FROM processed_events;

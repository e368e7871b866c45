-- Read by bench/hops: the times a service's database keeps of the events it
-- published and the events it consumed.

-- name: PublishedEvents :many
-- sent_at is when the first batch that covers the row was recorded: after
-- its ack, and after the row was written.
SELECT o.event_id, o.subject, o.event_type, o.event_time, s.recorded_at AS sent_at
FROM outbox o
CROSS JOIN LATERAL (
    SELECT b.recorded_at FROM outbox_batch b
    WHERE b.recorded_at >= o.created_at AND b.upto >= o.id AND pg_visible_in_snapshot(o.xact_id, b.snap)
    ORDER BY b.recorded_at
    LIMIT 1
) AS s;

-- name: ConsumedEvents :many
-- processed_at is the start of the transaction that claimed the event.
SELECT event_id, processed_at
FROM processed_events;

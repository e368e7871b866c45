-- +goose Up
-- The inbox's retention deletes an event's row by the time in its id (a
-- UUIDv7, which the envelope requires), through the primary key, which now
-- leads with the id: ids of older events sort first. The index on
-- processed_at goes, and with it one index entry per claimed event (the
-- claim is the inbox's cost over a consumer without one). The consumers'
-- retention guard checks the id's time as well as the event's.
--
-- Rebuilding the primary key locks the table while it runs, for a time
-- that grows with the rows kept (INBOX_RETENTION's worth of events).
ALTER TABLE processed_events
    DROP CONSTRAINT processed_events_pkey,
    ADD PRIMARY KEY (event_id, consumer);
DROP INDEX processed_events_processed_at_idx;

-- +goose Down
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);
ALTER TABLE processed_events
    DROP CONSTRAINT processed_events_pkey,
    ADD PRIMARY KEY (consumer, event_id);

-- +goose Up
-- The outbox's event ids lose their unique index. An id is a UUIDv7 the
-- producer makes for each event (event.New), so no two rows share one, and
-- what makes a duplicate harmless is downstream: the broker drops a
-- republished message id within its duplicate window, and every consumer's
-- inbox claims an event id once. The index cost two entries per event: one
-- when the row is written, in the producer's transaction, and one when the
-- relay marks it sent (the mark changes an indexed column, sent_at, so it
-- is never a HOT update and every index takes the new row version).
ALTER TABLE outbox DROP CONSTRAINT outbox_event_id_key;

-- +goose Down
ALTER TABLE outbox ADD CONSTRAINT outbox_event_id_key UNIQUE (event_id);

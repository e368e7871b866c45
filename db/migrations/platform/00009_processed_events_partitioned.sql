-- +goose Up
-- processed_events becomes partitioned by the time in the event's id
-- (minted_at, uuid7_time(event_id)): every delivery of an event, however
-- late, lands in the partition of its first, so the primary key, which
-- must hold the partition key, still admits one row per (event, consumer).
-- Retention drops whole partitions (internal/partition) instead of
-- deleting rows; the consumers' retention guard refuses an event older
-- than the retention, whose partition may be gone.
--
-- The rows kept so far move into one partition, processed_events_legacy,
-- up to the migration's time, dropped once the retention has passed it;
-- the maintenance adds partitions from there on. Rows outside every
-- partition (a database whose maintenance has not run yet, such as a test
-- database) go to processed_events_default, and the maintenance moves
-- them into their partition when it makes it. The move takes the table's
-- rows once (a lock on the table for as long), the price of migrating a
-- table that used to be deleted row by row.
ALTER TABLE processed_events RENAME TO processed_events_unpartitioned;
ALTER TABLE processed_events_unpartitioned RENAME CONSTRAINT processed_events_pkey TO processed_events_unpartitioned_pkey;

CREATE TABLE processed_events (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    -- The envelope's time; the retention guard checks it with minted_at.
    event_time   timestamptz NOT NULL,
    stream_seq   bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    -- uuid7_time(event_id): a function of the id, so the key below is
    -- unique exactly when (event_id, consumer) is.
    minted_at    timestamptz NOT NULL,
    PRIMARY KEY (event_id, consumer, minted_at)
) PARTITION BY RANGE (minted_at);

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('CREATE TABLE processed_events_legacy PARTITION OF processed_events FOR VALUES FROM (MINVALUE) TO (%L)', now());
END
$$;
-- +goose StatementEnd
CREATE TABLE processed_events_default PARTITION OF processed_events DEFAULT;

INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, processed_at, minted_at)
SELECT consumer, event_id, event_type, event_time, stream_seq, processed_at, uuid7_time(event_id)
FROM processed_events_unpartitioned;
DROP TABLE processed_events_unpartitioned;

-- +goose Down
ALTER TABLE processed_events RENAME TO processed_events_partitioned;
CREATE TABLE processed_events (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    event_time   timestamptz NOT NULL,
    stream_seq   bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, processed_at)
SELECT consumer, event_id, event_type, event_time, stream_seq, processed_at
FROM processed_events_partitioned;
DROP TABLE processed_events_partitioned;
ALTER TABLE processed_events ADD PRIMARY KEY (event_id, consumer);

-- +goose Up
-- The outbox becomes partitioned by created_at, the time of the producer's
-- transaction. A partition is dropped (internal/partition) once every row
-- in it is sent and was sent longer than the re-drive window ago, instead
-- of its sent rows being deleted one by one. The relay's claim, its marks
-- and the per-aggregate order rest on id, which stays one identity across
-- the partitions (the primary key adds the partition key, as it must).
--
-- The rows kept so far (the re-drive window's worth, an hour by default)
-- move into one partition, outbox_legacy, up to the migration's time; rows
-- outside every partition go to outbox_default until the maintenance
-- makes their partition (see 00009).
DROP TRIGGER outbox_notify ON outbox;
ALTER TABLE outbox RENAME TO outbox_unpartitioned;
ALTER TABLE outbox_unpartitioned RENAME CONSTRAINT outbox_pkey TO outbox_unpartitioned_pkey;
ALTER INDEX outbox_unsent_idx RENAME TO outbox_unpartitioned_unsent_idx;
ALTER INDEX outbox_sent_at_idx RENAME TO outbox_unpartitioned_sent_at_idx;
ALTER SEQUENCE outbox_id_seq RENAME TO outbox_unpartitioned_id_seq;

CREATE TABLE outbox (
    -- Publication order: the relay publishes unsent rows in id order.
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    source       text        NOT NULL,
    -- CloudEvents subject: the aggregate (e.g. the order id).
    subject      text        NOT NULL,
    nats_subject text        NOT NULL,
    event_time   timestamptz NOT NULL,
    data         json        NOT NULL,
    traceparent  text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL until a publish ack came back; sent rows are kept for the re-drive
    -- window, and their partition dropped after it.
    sent_at      timestamptz,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE INDEX outbox_unsent_idx ON outbox (id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_at_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('CREATE TABLE outbox_legacy PARTITION OF outbox FOR VALUES FROM (MINVALUE) TO (%L)', now());
END
$$;
-- +goose StatementEnd
CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;

INSERT INTO outbox (id, event_id, event_type, source, subject, nats_subject, event_time, data, traceparent, created_at, sent_at)
OVERRIDING SYSTEM VALUE
SELECT id, event_id, event_type, source, subject, nats_subject, event_time, data, traceparent, created_at, sent_at
FROM outbox_unpartitioned;
-- New rows take ids above every old one, so they are published after them.
SELECT setval(pg_get_serial_sequence('outbox', 'id'), max(id)) FROM outbox HAVING max(id) IS NOT NULL;
DROP TABLE outbox_unpartitioned;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- +goose Down
DROP TRIGGER outbox_notify ON outbox;
ALTER TABLE outbox RENAME TO outbox_partitioned;
ALTER INDEX outbox_unsent_idx RENAME TO outbox_partitioned_unsent_idx;
ALTER INDEX outbox_sent_at_idx RENAME TO outbox_partitioned_sent_at_idx;
ALTER TABLE outbox_partitioned RENAME CONSTRAINT outbox_pkey TO outbox_partitioned_pkey;
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    source       text        NOT NULL,
    subject      text        NOT NULL,
    nats_subject text        NOT NULL,
    event_time   timestamptz NOT NULL,
    data         json        NOT NULL,
    traceparent  text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz
);
CREATE INDEX outbox_unsent_idx ON outbox (id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_at_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;
INSERT INTO outbox (id, event_id, event_type, source, subject, nats_subject, event_time, data, traceparent, created_at, sent_at)
OVERRIDING SYSTEM VALUE
SELECT id, event_id, event_type, source, subject, nats_subject, event_time, data, traceparent, created_at, sent_at
FROM outbox_partitioned;
SELECT setval(pg_get_serial_sequence('outbox', 'id'), max(id)) FROM outbox HAVING max(id) IS NOT NULL;
DROP TABLE outbox_partitioned;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- The relay's claim read every outbox partition about nine times a call
-- (the generic plan sets up every partition's scan of every branch, run or
-- not), and it cost five times the claim of the unpartitioned outbox. Two
-- changes here, and the claim's own (db/queries/outbox Claim):
--
--   - "Covered" is written once, as outbox_covered: a row is sent when the
--     relay's position covers it (see 00013). outbox_unsent_after lists the
--     rows it does not cover, and the claim's page of a span filters by it.
--   - The highest id a statement can see is bounded by the identity's
--     sequence, read in O(1), not by max(id), which read every partition:
--     a row gets its id from the sequence before it commits, so no row
--     that a snapshot sees has an id above the sequence's last value. A
--     higher bound covers nothing more: a row is covered only if its
--     transaction is visible in the position's snapshot as well.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION outbox_covered(id bigint, xact_id xid8, snap pg_snapshot, upto bigint, span_snap pg_snapshot, span_done bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT (id <= upto AND pg_visible_in_snapshot(xact_id, snap))
        OR (id <= span_done AND pg_visible_in_snapshot(xact_id, span_snap))
$$;
-- +goose StatementEnd

-- The highest id handed out, or 0: at least the id of every row any
-- snapshot sees. Volatile, as the sequence is, so that it is inlined.
-- +goose StatementBegin
CREATE FUNCTION outbox_last_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(pg_sequence_last_value('outbox_id_seq'::regclass), 0)
$$;
-- +goose StatementEnd

-- THE definition of unsent: the outbox rows a position does not cover.
-- The three branches are where such rows can be: every row above upto,
-- and below it the rows of the transactions not visible in snap, those
-- that began after it (xact_id from its xmax up) and those of its running
-- list. Each is a range or probes of an index, bounded above so that a
-- generic plan reads it as a range and not as a third of the table; the
-- bounds cut nothing, as no row the statement sees lies beyond them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_unsent_after(snap pg_snapshot, upto bigint, span_snap pg_snapshot, span_done bigint)
RETURNS SETOF outbox LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        SELECT * FROM outbox
        WHERE id > upto AND id <= (SELECT outbox_last_id())
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id >= pg_snapshot_xmax(snap) AND xact_id < pg_snapshot_xmax(pg_current_snapshot())
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id = ANY (ARRAY(SELECT pg_snapshot_xip(snap)))
          AND xact_id >= pg_snapshot_xmin(snap) AND xact_id < pg_snapshot_xmax(snap)
    ) AS o
    WHERE NOT outbox_covered(o.id, o.xact_id, snap, upto, span_snap, span_done)
$$;
-- +goose StatementEnd

-- +goose Down
-- 00013's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_unsent_after(snap pg_snapshot, upto bigint, span_snap pg_snapshot, span_done bigint)
RETURNS SETOF outbox LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        SELECT * FROM outbox
        WHERE id > upto AND id <= (SELECT max(id) FROM outbox)
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id >= pg_snapshot_xmax(snap) AND xact_id < pg_snapshot_xmax(pg_current_snapshot())
        UNION ALL
        SELECT * FROM outbox
        WHERE id <= upto
          AND xact_id = ANY (ARRAY(SELECT pg_snapshot_xip(snap)))
          AND xact_id >= pg_snapshot_xmin(snap) AND xact_id < pg_snapshot_xmax(snap)
    ) AS o
    WHERE o.id > span_done OR NOT pg_visible_in_snapshot(o.xact_id, span_snap)
$$;
-- +goose StatementEnd
DROP FUNCTION outbox_last_id();
DROP FUNCTION outbox_covered(bigint, xid8, pg_snapshot, bigint, pg_snapshot, bigint);

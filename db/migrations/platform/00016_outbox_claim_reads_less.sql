-- The relay's claim read every outbox partition about nine times a call
-- (the generic plan sets up every partition's scan of every branch, run or
-- not), and it cost five times the claim of the unpartitioned outbox. It
-- now reads each about three times (with the claim's own change, in
-- db/queries/outbox Claim):
--
--   - "Covered" is written once, as outbox_covered: a row is sent when the
--     relay's position covers it (see 00013). outbox_unsent_after lists the
--     rows it does not cover, and the claim's page of a span filters by it.
--   - outbox_unsent_after has two branches, not three: every position's
--     upto is at least every id its snapshot sees, so the rows above upto
--     that it does not cover are those of transactions it does not see,
--     which the two xact_id branches find. The claim's new span (the case
--     without a backlog) sorts what they find; a span's later pages are
--     one id range.
--   - The rows written before 00012, whose xact_id is 0, take 1 (below).
--   - The highest id a statement can see is bounded by the identity's
--     sequence, read in O(1), not by max(id), which read every partition:
--     a row gets its id from the sequence before it commits, so no row
--     that a snapshot sees has an id above the sequence's last value read
--     after it. A higher bound covers nothing more: a row is covered only
--     if its transaction is visible in the position's snapshot as well.

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
-- Every position's upto is at least the id of every row its snap sees (a
-- closing position's upto is outbox_last_id, read after its snapshot; the
-- others take their snap and upto from one), so a row not covered is one
-- whose transaction is not visible in snap, or a row of the span not yet
-- sent: one of a transaction that began after snap (xact_id from its xmax
-- up) or was running in it (its running list). The two branches are
-- those, an index range and probes, bounded above so that a generic plan
-- reads them as a range and not as a third of the table; the bound cuts
-- nothing, as no transaction a statement sees lies beyond it. What they
-- find is filtered by outbox_covered.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_unsent_after(snap pg_snapshot, upto bigint, span_snap pg_snapshot, span_done bigint)
RETURNS SETOF outbox LANGUAGE sql STABLE AS $$
    SELECT * FROM (
        SELECT * FROM outbox
        WHERE xact_id >= pg_snapshot_xmax(snap) AND xact_id < pg_snapshot_xmax(pg_current_snapshot())
        UNION ALL
        SELECT * FROM outbox
        WHERE xact_id = ANY (ARRAY(SELECT pg_snapshot_xip(snap)))
          AND xact_id >= pg_snapshot_xmin(snap) AND xact_id < pg_snapshot_xmax(snap)
    ) AS o
    WHERE NOT outbox_covered(o.id, o.xact_id, snap, upto, span_snap, span_done)
$$;
-- +goose StatementEnd

-- The rows written before 00012 have xact_id 0, which every snapshot sees,
-- even '1:1:', the position that covers nothing (a redrive to before the
-- first record): that position's upto, 0, would be below ids its snapshot
-- sees. 1 is as old for every real snapshot (their xmin is at least 3) and
-- not seen by '1:1:'. An index probe, and only the rows of before 00012.
UPDATE outbox SET xact_id = '1' WHERE xact_id = '0';

-- +goose Down
UPDATE outbox SET xact_id = '0' WHERE xact_id = '1';
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

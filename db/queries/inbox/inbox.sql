-- name: ClaimEvent :one
-- Claims one event for a consumer. No row back means the event was already
-- processed (or is being processed by a transaction this insert waited for).
-- The row goes to the partition of the time in the event's id, the same
-- for every delivery of the event, where the primary key finds an earlier
-- claim (db/migrations/platform/00009).
INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
VALUES (@consumer, @event_id, @event_type, @event_time, @stream_seq, uuid7_time(@event_id))
ON CONFLICT DO NOTHING
RETURNING event_id;

-- name: ClaimPastRetention :exec
-- Lets the transaction's claims go below the oldest partition of
-- processed_events, which the DEFAULT partition's trigger refuses
-- otherwise (db/migrations/platform/00014): for an operator's replay forced
-- past the retention, which a dropped partition may have processed.
SELECT set_config('onceflow.claim_past_retention', 'on', true);

-- name: ClaimEvents :many
-- Claims a batch with one statement. The rows are inserted in event id
-- order, so two overlapping batches lock keys in the same order and cannot
-- deadlock; the ids returned are the events that are new.
INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
SELECT @consumer::text, e.event_id, e.event_type, e.event_time, e.stream_seq, uuid7_time(e.event_id)
FROM (
    -- Set-returning functions in one select list advance in lockstep.
    SELECT
        unnest(@event_ids::uuid[])          AS event_id,
        unnest(@event_types::text[])        AS event_type,
        unnest(@event_times::timestamptz[]) AS event_time,
        unnest(@stream_seqs::bigint[])      AS stream_seq
) AS e
ORDER BY e.event_id
ON CONFLICT DO NOTHING
RETURNING event_id;

-- name: ClaimNewEvents :exec
-- Claims a batch of first deliveries with one statement, on the bet that
-- none of them was processed before (the batch path's claim ahead): a
-- plain insert, which PostgreSQL runs for less than ClaimEvents' ON
-- CONFLICT (a speculative insertion per row: a 100-row claim took 7–42 %
-- less time in pgbench), and which needs no answer, so it goes with the
-- handler's first statement. An event processed before fails it with a
-- unique violation, and the batch is claimed again with ClaimEvents. Rows
-- go in event id order, as with ClaimEvents.
INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
SELECT @consumer::text, e.event_id, e.event_type, e.event_time, e.stream_seq, uuid7_time(e.event_id)
FROM (
    SELECT
        unnest(@event_ids::uuid[])          AS event_id,
        unnest(@event_types::text[])        AS event_type,
        unnest(@event_times::timestamptz[]) AS event_time,
        unnest(@stream_seqs::bigint[])      AS stream_seq
) AS e
ORDER BY e.event_id;

-- name: PlanEachCall :exec
-- Plans the transaction's statements for their arguments from here on: the
-- reads of a set-based batch. A generic plan assumes an array parameter
-- holds ten elements and keeps the table sizes of the moment it was made:
-- a `sku = ANY(@skus)` over a batch's hundred SKUs, planned while the table
-- was small, scans and compares every row for every batch until ANALYZE
-- invalidates it (four of the nine milliseconds of an inventory batch). A
-- plan per call costs a few tens of microseconds, once per batch.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: PlanGeneric :exec
-- Runs the rest of the transaction's prepared statements with their generic
-- plans: the writes of a set-based batch, inserts from arrays and updates
-- joined on a key, whose generic plans (index probes) serve any batch. A
-- generic plan is made once per connection, on the table as it is then: an
-- update joined to arrays names its keys with = ANY as well, so that its
-- plan probes the key even if made on a nearly empty table
-- (db/plans_test.go).
-- PostgreSQL would plan them anew for every call: for the few events of a
-- batch under light load, a plan for the particular arrays looks cheaper
-- than the generic one. At 300 orders/s their planning took a tenth of the
-- deployment's statement time (pg_stat_statements).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

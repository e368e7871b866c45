-- name: ClaimKey :one
-- Claims the key in the request's transaction. A concurrent request with the
-- same key waits here until the first commits (then sees the conflict and
-- replays its response) or rolls back (then claims the key itself). The
-- wait is bounded by @lock_timeout, set for the rest of the transaction by
-- the subquery, which runs before the row is inserted: one round trip
-- instead of two.
INSERT INTO idempotency_keys (scope, key, fingerprint)
SELECT @scope, @key, @fingerprint
FROM (SELECT set_config('lock_timeout', @lock_timeout::text, true)) AS bound
ON CONFLICT DO NOTHING
RETURNING created_at;

-- name: ClaimNewKey :exec
-- Claims a key expected to be new, ahead of the request's writes, its
-- stored response and the commit, all in one round trip: it fails with
-- unique_violation when the key was claimed and committed before, which
-- aborts the statements behind it, and with lock_not_available after
-- waiting @lock_timeout for a request in flight with the same key.
INSERT INTO idempotency_keys (scope, key, fingerprint)
SELECT @scope, @key, @fingerprint
FROM (SELECT set_config('lock_timeout', @lock_timeout::text, true)) AS bound;

-- name: GetKey :one
SELECT fingerprint, status_code, response_headers, response_body
FROM idempotency_keys
WHERE scope = @scope AND key = @key;

-- name: CompleteKey :exec
UPDATE idempotency_keys
SET status_code = @status_code, response_headers = @response_headers, response_body = @response_body, completed_at = now()
WHERE scope = @scope AND key = @key;

-- name: DeleteKeysBefore :execrows
-- Deletes at most @max_rows keys created before @before, by their physical
-- address: an IN (subquery) on the key was a hash join that read the whole
-- table for every batch (300,000 keys: 120 ms a batch against 11).
DELETE FROM idempotency_keys
WHERE ctid = ANY (ARRAY(
    SELECT k.ctid FROM idempotency_keys k
    WHERE k.created_at < @before
    LIMIT @max_rows
));

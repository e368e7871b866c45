// Package postgres opens connection pools and migrates service databases,
// and holds the few helpers that save round trips to them.
//
// A database's Schema is an ordered list of migration sets (the platform set
// first, then the service's own); each set is applied with goose and
// versioned in its own table, under a PostgreSQL advisory lock so that
// replicas starting together do not race each other.
//
// The helpers are sqlc DBTXs, so that queries still go through the
// generated code: BeginWith sends a transaction's BEGIN with its first
// statement (and its COMMIT with the writes queued for it), Pipeline sends
// statements that need no answer from each other in one round trip (with
// Then, ahead of the next statement, which may answer; a failure is a
// QueryError that names the statement), WriteBehind queues a transaction's
// sqlc :exec statements until one that answers (or the COMMIT) carries
// them, and PlanEachCall has PostgreSQL
// plan each statement for its arguments (a set-based batch's arrays).
// IsLockNotAvailable recognises a lock_timeout that ran out.
package postgres

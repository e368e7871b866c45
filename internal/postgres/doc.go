// Package postgres opens connection pools and migrates service databases,
// and holds the few helpers that save round trips to them.
//
// A database's Schema is an ordered list of migration sets (the platform set
// first, then the service's own); each set is applied with goose and
// versioned in its own table, under a PostgreSQL advisory lock so that
// replicas starting together do not race each other.
//
// The helpers are sqlc DBTXs, so that queries still go through the
// generated code: BeginWith sends a transaction's BEGIN, and the statements
// queued ahead of the rest, with its first statement (or with its COMMIT
// and the writes queued for it), Pipeline sends statements that need no
// answer from each other in one round trip (with Then, ahead of the next
// statement, which may answer; a failure is a QueryError that names the
// statement), and a statement that pgx could not encode or the server
// could not prepare is blamed by its SQL, not on the statements sent with
// it.
// IsLockNotAvailable recognises a lock_timeout that ran out, and
// IsUniqueViolation a unique key's violation.
package postgres

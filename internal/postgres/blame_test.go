package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The statements as sqlc writes them: its name line says what the method
// returns.
const (
	insertOne   = "-- name: InsertOne :exec\nINSERT INTO effects VALUES ($1)"
	insertCount = "-- name: InsertCount :execrows\nINSERT INTO effects VALUES ($1)"
	countAll    = "-- name: CountAll :one\nSELECT count(*) FROM effects"
)

// effectsPool returns a pool of a fresh database with an effects table, and
// the count of its round trips.
func effectsPool(t *testing.T) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	db := testenv.NewServiceDatabase(t, "")
	_, err := db.Pool.Exec(t.Context(), "CREATE TABLE effects (n int PRIMARY KEY)")
	require.NoError(t, err)
	return db.CountingPool(t)
}

// Statements that cannot be sent: pgx cannot encode the argument, or the
// server cannot prepare the statement. pgx then fails every statement of
// the round trip with the same error, before any is sent.
var unsendable = []struct {
	name  string
	query string
	sql   string
	arg   any
}{
	{"unencodable argument", "Narrow", "-- name: Narrow :one\nSELECT $1::int4", int64(1) << 40},
	{"unpreparable statement", "NoColumn", "-- name: NoColumn :one\nSELECT no_such_column FROM effects WHERE n = $1", 1},
}

// A statement that cannot be sent with BEGIN and what is queued ahead of it
// is named as the one that failed, not the statement ahead: nothing was
// sent, and the transaction fails with that statement's error.
func TestBeginWithBlamesAStatementThatCannotBeSentOnItself(t *testing.T) {
	t.Parallel()
	for _, tc := range unsendable {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, _ := effectsPool(t)
			b := postgres.BeginWith(pool)
			t.Cleanup(func() { b.End(context.Background()) })
			var aheadErr error
			b.Ahead().AfterSend(func(err error) { aheadErr = err })
			_, _ = b.Ahead().Exec(ctx, insertOne, 1)

			var n int64
			err := b.Tx().QueryRow(ctx, tc.sql, tc.arg).Scan(&n)
			var qe *postgres.QueryError
			require.ErrorAs(t, err, &qe)
			require.Equal(t, tc.query, qe.Query, "blamed on another statement")
			require.ErrorAs(t, aheadErr, &qe, "the statement ahead did not learn why it was not sent")
			require.Equal(t, tc.query, qe.Query, "the statement ahead was blamed")
			require.Error(t, b.Commit(ctx, nil))
		})
	}
}

// A Pipeline names the statement that could not be sent, not the first
// one it holds.
func TestPipelineNamesTheStatementThatCouldNotBeSent(t *testing.T) {
	t.Parallel()
	for _, tc := range unsendable {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, _ := effectsPool(t)
			var p postgres.Pipeline
			_, _ = p.Exec(ctx, insertOne, 1)
			_, _ = p.Exec(ctx, tc.sql, tc.arg)
			_, _ = p.Exec(ctx, insertOne, 2)
			err := p.Send(ctx, pool)
			var qe *postgres.QueryError
			require.ErrorAs(t, err, &qe)
			require.Equal(t, 1, qe.Index, "blamed: %v", qe)
			require.Equal(t, tc.query, qe.Query)
			var n int64
			require.NoError(t, pool.QueryRow(ctx, countAll).Scan(&n))
			require.Zero(t, n, "nothing was sent")
		})
	}
}

// Rows read to the end are closed, as pgx promises: the transaction's next
// statement runs, though nothing called Close.
func TestRowsReadToTheEndFreeTheTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		ahead bool // a statement is queued ahead of the read
	}{{"the first statement", false}, {"with a statement ahead", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, _ := effectsPool(t)
			b := postgres.BeginWith(pool)
			t.Cleanup(func() { b.End(context.Background()) })
			if tc.ahead {
				_, _ = b.Ahead().Exec(ctx, insertOne, 1)
			}
			tx := b.Tx()
			rows, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 3) AS g")
			require.NoError(t, err)
			var got []int32
			for rows.Next() {
				var g int32
				require.NoError(t, rows.Scan(&g))
				got = append(got, g)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []int32{1, 2, 3}, got)

			_, err = tx.Exec(ctx, insertCount, 2) // no rows.Close() before it
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
		})
	}
}

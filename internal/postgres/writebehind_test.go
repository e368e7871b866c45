package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
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

// A handler that writes, reads and writes again costs one round trip for
// the read, which sees the writes before it, and none for its writes: the
// last go with the COMMIT.
func TestWriteBehindQueuesExecsUntilAStatementAnswers(t *testing.T) {
	t.Parallel()
	pool, trips := effectsPool(t)
	ctx := t.Context()

	begin, wb := beginWriteBehind(t, pool)
	start := trips.Load()

	for _, n := range []int{1, 2} {
		_, err := wb.Exec(ctx, insertOne, n)
		require.NoError(t, err)
	}
	require.Equal(t, start, trips.Load(), ":exec statements are queued")

	var count int64
	require.NoError(t, wb.QueryRow(ctx, countAll).Scan(&count))
	require.EqualValues(t, 2, count, "the read runs after the queued writes")
	require.Equal(t, start+1, trips.Load(), "in one round trip")

	tag, err := wb.Exec(ctx, insertCount, 3)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "an :execrows answers at once")
	require.Equal(t, start+2, trips.Load())

	_, err = wb.Exec(ctx, insertOne, 4)
	require.NoError(t, err)
	require.NoError(t, begin.Commit(ctx, wb.Writes()))
	require.Equal(t, start+3, trips.Load(), "the last write goes with the COMMIT")
	require.Nil(t, wb.Err())

	rows, _ := pool.Query(ctx, "SELECT n FROM effects ORDER BY n")
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 3, 4}, ns)
}

// A queued write that fails is blamed on the owner that queued it, whoever
// sent it: the next statement that answers, or the COMMIT.
func TestWriteBehindBlamesAFailedWriteOnItsOwner(t *testing.T) {
	t.Parallel()
	pool, _ := effectsPool(t)

	for _, tc := range []struct {
		name string
		send func(ctx context.Context, begin *postgres.TxStart, wb *postgres.WriteBehindTx) error
	}{
		{
			name: "sent by a read",
			send: func(ctx context.Context, _ *postgres.TxStart, wb *postgres.WriteBehindTx) error {
				var count int64
				return wb.QueryRow(ctx, countAll).Scan(&count)
			},
		},
		{
			name: "sent by the commit",
			send: func(ctx context.Context, begin *postgres.TxStart, wb *postgres.WriteBehindTx) error {
				return begin.Commit(ctx, wb.Writes())
			},
		},
		{
			name: "sent ahead of a savepoint",
			send: func(ctx context.Context, _ *postgres.TxStart, wb *postgres.WriteBehindTx) error {
				_, err := wb.Begin(ctx)
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			begin, wb := beginWriteBehind(t, pool)

			for owner, n := range []int{10, 11, 10, 12} { // owner 2 repeats owner 0's key
				wb.Own(owner)
				_, err := wb.Exec(ctx, insertOne, n)
				require.NoError(t, err)
			}
			err := tc.send(ctx, begin, wb)

			var qe *postgres.QueryError
			require.ErrorAs(t, err, &qe)
			require.Equal(t, "InsertOne", qe.Query)
			require.Equal(t, 2, qe.Index)
			require.NotNil(t, wb.Err())
			require.Equal(t, 2, wb.Err().Owner)
			require.ErrorContains(t, wb.Err(), "duplicate key")

			_, err = wb.Exec(ctx, insertOne, 13)
			require.True(t, errors.Is(err, wb.Err()), "the failure sticks: %v", err)
		})
	}
}

// beginWriteBehind returns a transaction on pool as the inbox runs a
// handler's: it begins with its first statement, and its writes are
// queued. It ends with the test.
func beginWriteBehind(t *testing.T, pool *pgxpool.Pool) (*postgres.TxStart, *postgres.WriteBehindTx) {
	t.Helper()
	begin := postgres.BeginWith(pool)
	t.Cleanup(func() { begin.End(context.Background()) })
	return begin, postgres.WriteBehind(begin.Tx())
}

// effectsPool returns a pool of a new database with the table effects,
// which counts its round trips.
func effectsPool(t *testing.T) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	db := testenv.NewServiceDatabase(t, "")
	_, err := db.Pool.Exec(t.Context(), "CREATE TABLE effects (n int PRIMARY KEY)")
	require.NoError(t, err)
	return db.CountingPool(t)
}

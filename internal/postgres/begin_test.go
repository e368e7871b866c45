package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestBeginWithOpensTheTransactionOfItsStatement(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, "")
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE effects (n int)")
	require.NoError(t, err)
	count := func() (n int) {
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n))
		return n
	}

	// Committed: the statement, the ones after it and the writes queued
	// for the commit are one transaction.
	b := postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (1)")
	require.NoError(t, err)
	_, err = b.Tx().Exec(ctx, "INSERT INTO effects VALUES (2)")
	require.NoError(t, err)
	var writes postgres.Pipeline
	exec(t, &writes, "INSERT INTO effects VALUES (3)")
	require.Zero(t, count(), "visible before the commit")
	require.NoError(t, b.Commit(ctx, &writes))
	b.End(ctx)
	require.Equal(t, 3, count())
	require.Zero(t, db.Pool.Stat().AcquiredConns(), "the connection is back")

	// Not committed: End rolls back, and nothing stays.
	b = postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (4)")
	require.NoError(t, err)
	b.End(ctx)
	require.Equal(t, 3, count())

	// A write queued for the commit fails: nothing is committed, and End
	// rolls back the aborted transaction.
	b = postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (5)")
	require.NoError(t, err)
	writes = postgres.Pipeline{}
	exec(t, &writes, "-- name: Broken :exec\nINSERT INTO effects VALUES (1 / 0)")
	require.ErrorContains(t, b.Commit(ctx, &writes), "Broken: ")
	b.End(ctx)
	require.Equal(t, 3, count())
	require.Zero(t, db.Pool.Stat().AcquiredConns(), "the connection is back")

	// A statement failed and its error was ignored: COMMIT rolls back, and
	// Commit says so.
	b = postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (6)")
	require.NoError(t, err)
	_, err = b.Tx().Exec(ctx, "INSERT INTO effects VALUES (1 / 0)")
	require.Error(t, err)
	require.ErrorIs(t, b.Commit(ctx, nil), pgx.ErrTxCommitRollback)
	b.End(ctx)
	require.Equal(t, 3, count())

	// A failed statement, whether it fails before BEGIN ran (it could not
	// be prepared) or after, leaves nothing and gives the connection back.
	for _, sql := range []string{"INSERT INTO missing VALUES (1)", "INSERT INTO effects VALUES (1 / 0)"} {
		b = postgres.BeginWith(db.Pool)
		_, err = b.Exec(ctx, sql)
		require.Error(t, err, sql)
		_, err = b.Tx().Exec(ctx, "INSERT INTO effects VALUES (7)")
		require.Error(t, err, "%s: the transaction goes on after a failure", sql)
		b.End(ctx)
		require.Zero(t, db.Pool.Stat().AcquiredConns(), "%s: a connection was kept", sql)
	}
	require.Equal(t, 3, count())
}

// Statements queued ahead go to the server after BEGIN, in the round trip
// of the transaction's first statement, or of the COMMIT if there is no
// other: a whole transaction that needs no answer is one round trip.
func TestBeginWithSendsWhatIsQueuedAheadWithTheNextStatement(t *testing.T) {
	t.Parallel()
	pool, trips := effectsPool(t)
	ctx := t.Context()
	var numbers []int32
	read := func() {
		rows, _ := pool.Query(ctx, "SELECT n FROM effects ORDER BY n")
		var err error
		numbers, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
	}

	// Ahead of a read, and later ahead of the next statement.
	b := postgres.BeginWith(pool)
	start := trips.Load()
	var aheadErrs []error
	_, _ = b.Ahead().Exec(ctx, insertOne, 1)
	b.Ahead().AfterSend(func(err error) { aheadErrs = append(aheadErrs, err) })
	require.Equal(t, start, trips.Load(), "queued, not sent")
	var count int64
	require.NoError(t, b.Tx().QueryRow(ctx, countAll).Scan(&count))
	require.EqualValues(t, 1, count, "the read ran after BEGIN and the statement queued ahead")
	require.Equal(t, start+1, trips.Load(), "in one round trip")
	require.Equal(t, []error{nil}, aheadErrs)
	_, _ = b.Ahead().Exec(ctx, insertOne, 2)
	require.NoError(t, b.Tx().QueryRow(ctx, countAll).Scan(&count))
	require.EqualValues(t, 2, count)
	require.Equal(t, start+2, trips.Load())
	require.NoError(t, b.Commit(ctx, nil))
	b.End(ctx)
	require.Equal(t, start+3, trips.Load())

	// Ahead of the writes and the COMMIT: one round trip.
	b = postgres.BeginWith(pool)
	start = trips.Load()
	_, _ = b.Ahead().Exec(ctx, insertOne, 3)
	var writes postgres.Pipeline
	_, _ = writes.Exec(ctx, insertOne, 4)
	require.NoError(t, b.Commit(ctx, &writes))
	b.End(ctx)
	require.Equal(t, start+1, trips.Load(), "BEGIN, ahead, writes and COMMIT in one round trip")
	read()
	require.Equal(t, []int32{1, 2, 3, 4}, numbers)
	require.Zero(t, pool.Stat().AcquiredConns(), "the connection is back")
}

// A statement queued ahead that fails fails the statement that carried it,
// which does not run, and the transaction; its AfterSend functions learn of
// it.
func TestBeginWithFailsWhatCarriedAFailedStatementQueuedAhead(t *testing.T) {
	t.Parallel()
	pool, _ := effectsPool(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "INSERT INTO effects VALUES (1)")
	require.NoError(t, err)

	for _, carrier := range []struct {
		name string
		send func(*postgres.TxStart) error
	}{
		{"a read", func(b *postgres.TxStart) error {
			var n int64
			return b.Tx().QueryRow(ctx, countAll).Scan(&n)
		}},
		{"a write", func(b *postgres.TxStart) error {
			_, err := b.Tx().Exec(ctx, insertCount, 2)
			return err
		}},
		{"the commit", func(b *postgres.TxStart) error {
			var writes postgres.Pipeline
			_, _ = writes.Exec(ctx, insertOne, 2)
			return b.Commit(ctx, &writes)
		}},
	} {
		t.Run(carrier.name, func(t *testing.T) {
			b := postgres.BeginWith(pool)
			var aheadErr error
			_, _ = b.Ahead().Exec(ctx, insertOne, 1) // the key is taken
			b.Ahead().AfterSend(func(err error) { aheadErr = err })
			err := carrier.send(b)
			require.ErrorContains(t, err, "InsertOne: ")
			require.True(t, postgres.IsUniqueViolation(err), "%v", err)
			require.True(t, postgres.IsUniqueViolation(aheadErr), "%v", aheadErr)
			require.Error(t, b.Commit(ctx, nil), "the transaction is aborted")
			b.End(ctx)
			require.Zero(t, pool.Stat().AcquiredConns(), "the connection is back")
		})
	}
	var n int64
	require.NoError(t, pool.QueryRow(ctx, countAll).Scan(&n))
	require.EqualValues(t, 1, n, "nothing was written")
}

// A transaction that cannot get a connection fails every statement with
// why, the ones queued ahead included, and has nothing to end.
func TestBeginWithWithoutAConnectionFailsEveryStatement(t *testing.T) {
	t.Parallel()
	pool, _ := effectsPool(t)
	ctx := t.Context()
	pool.Close()

	b := postgres.BeginWith(pool)
	var aheadErr error
	_, _ = b.Ahead().Exec(ctx, insertOne, 1)
	b.Ahead().AfterSend(func(err error) { aheadErr = err })
	var n int64
	require.ErrorContains(t, b.Tx().QueryRow(ctx, countAll).Scan(&n), "acquire a connection")
	require.ErrorContains(t, aheadErr, "acquire a connection")
	_, err := b.Exec(ctx, insertOne, 2)
	require.ErrorContains(t, err, "acquire a connection")
	require.ErrorContains(t, b.Commit(ctx, nil), "acquire a connection")
	b.End(ctx)
}

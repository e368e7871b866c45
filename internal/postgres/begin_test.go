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
	tx, err := b.Tx()
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO effects VALUES (2)")
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
	_, err = b.Tx()
	require.NoError(t, err)
	b.End(ctx)
	require.Equal(t, 3, count())

	// A write queued for the commit fails: nothing is committed, and End
	// rolls back the aborted transaction.
	b = postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (5)")
	require.NoError(t, err)
	_, err = b.Tx()
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
	tx, err = b.Tx()
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO effects VALUES (1 / 0)")
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
		_, err = b.Tx()
		require.Error(t, err, sql)
		b.End(ctx)
		require.Zero(t, db.Pool.Stat().AcquiredConns(), "%s: a connection was kept", sql)
	}
	require.Equal(t, 3, count())
}

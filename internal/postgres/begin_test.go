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

	// Committed: the statement and the ones after it are one transaction.
	b := postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (1)")
	require.NoError(t, err)
	tx, err := b.Tx()
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO effects VALUES (2)")
	require.NoError(t, err)
	require.Zero(t, count(), "visible before the commit")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2, count())

	// Rolled back: neither statement stays.
	b = postgres.BeginWith(db.Pool)
	_, err = b.Exec(ctx, "INSERT INTO effects VALUES (3)")
	require.NoError(t, err)
	tx, err = b.Tx()
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 2, count())

	// A failed statement, whether it fails before BEGIN ran (it could not
	// be prepared) or after, leaves nothing and gives the connection back.
	for _, sql := range []string{"INSERT INTO missing VALUES (1)", "INSERT INTO effects VALUES (1 / 0)"} {
		b = postgres.BeginWith(db.Pool)
		_, err = b.Exec(ctx, sql)
		require.Error(t, err, sql)
		tx, err = b.Tx()
		require.Error(t, err, sql)
		if err := tx.Rollback(ctx); err != nil {
			require.ErrorIs(t, err, pgx.ErrTxClosed, sql)
		}
		require.Zero(t, db.Pool.Stat().AcquiredConns(), "%s: a connection was kept", sql)
	}
	require.Equal(t, 2, count())
}

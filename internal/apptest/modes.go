package apptest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
)

// PerEvent configures a service to run every event of a batch under its own
// handler instead of a subscription's set-based batch handler.
func PerEvent(cfg *app.Config) { cfg.ConsumerSetBased = false }

// EachMode runs f as two parallel subtests of name: with the set-based batch
// handlers (the default), and per event, the reference the batch handlers
// must equal.
func EachMode(t *testing.T, name string, f func(t *testing.T, mode func(*app.Config))) {
	t.Helper()
	for _, m := range []struct {
		name      string
		configure func(*app.Config)
	}{
		{"set-based", func(*app.Config) {}},
		{"per-event", PerEvent},
	} {
		t.Run(strings.TrimPrefix(name+"/"+m.name, "/"), func(t *testing.T) {
			t.Parallel()
			f(t, m.configure)
		})
	}
}

// InTx runs f in a transaction and commits it.
func InTx(t *testing.T, pool *pgxpool.Pool, f func(context.Context, pgx.Tx) error) {
	t.Helper()
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, f(ctx, tx))
	require.NoError(t, tx.Commit(ctx))
}

// Rows returns every row of query, for comparing two databases.
func Rows(t *testing.T, pool *pgxpool.Pool, query string) [][]any {
	t.Helper()
	rows, err := pool.Query(t.Context(), query)
	require.NoError(t, err)
	defer rows.Close()
	var all [][]any
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		all = append(all, vals)
	}
	require.NoError(t, rows.Err())
	return all
}

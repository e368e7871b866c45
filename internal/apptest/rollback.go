package apptest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"

	"github.com/onceflow/onceflow/internal/testenv"
)

// Handled is an event and the per-event handler to run it, one case of
// RequireRollsBack.
type Handled struct {
	Name   string
	Handle inbox.Handler
	Event  event.Envelope
}

// RequireRollsBack runs each case's handler on its event in a transaction
// and rolls it back. Each handler must succeed and change the database in
// the transaction, and the rollback must undo all of it: a write or an
// outbox insert made through a connection of its own, not the transaction
// the handler was given, would outlive the rollback (or be applied when the
// inbox's commit fails).
func RequireRollsBack(t *testing.T, pool *pgxpool.Pool, cases ...Handled) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ctx := t.Context()
			before := tables(t, pool)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			require.NoError(t, c.Handle(ctx, tx, c.Event))
			require.NotEqual(t, before, tables(t, tx), "the handler changed nothing")
			require.NoError(t, tx.Rollback(ctx))
			require.Equal(t, before, tables(t, pool), "the rollback leaves every table as it was")
		})
	}
}

// tables returns every row of every table q sees (testenv.Tables).
func tables(t *testing.T, q testenv.Querier) map[string]string {
	t.Helper()
	all, err := testenv.Tables(t.Context(), q)
	require.NoError(t, err)
	return all
}

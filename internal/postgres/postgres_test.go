package postgres_test

import (
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// Replicas of a service start together and migrate the same database: the
// session lock serialises them and the later ones find nothing to do.
func TestConcurrentMigrationsApplyOnce(t *testing.T) {
	t.Parallel()
	platform, err := postgres.ServiceSchema("")
	require.NoError(t, err)
	db := testenv.NewDatabase(t, platform)
	schema, err := postgres.ServiceSchema("payment")
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = postgres.Migrate(t.Context(), db.Pool, schema, slog.New(slog.DiscardHandler)) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var tables int
	require.NoError(t, db.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM information_schema.tables WHERE table_name IN ('wallets', 'payments', 'processed_events', 'outbox')`).Scan(&tables))
	require.Equal(t, 4, tables)
}

func TestUnknownServiceSchema(t *testing.T) {
	t.Parallel()
	_, err := postgres.ServiceSchema("nope")
	require.Error(t, err)
}

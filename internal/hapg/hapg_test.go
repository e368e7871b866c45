package hapg_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/hapg"
)

// start starts a cluster stopped when the test ends, which then checks that
// no process was left in its directory.
func start(t *testing.T, cfg hapg.Config) *hapg.Cluster {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := hapg.Start(t.Context(), cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Stop(ctx))
		require.Empty(t, processesUnder(t, c.Dir()), "processes left in the cluster's directory")
	})
	return c
}

// processesUnder returns the processes whose working directory is dir or
// below it, as PostgreSQL's, etcd's and Patroni's are.
func processesUnder(t *testing.T, dir string) []string {
	t.Helper()
	cwds, err := filepath.Glob("/proc/[0-9]*/cwd")
	require.NoError(t, err)
	var found []string
	for _, cwd := range cwds {
		got, err := os.Readlink(cwd)
		if err == nil && (got == dir || filepath.Dir(got) == dir || filepath.Dir(filepath.Dir(got)) == dir) {
			found = append(found, cwd+" -> "+got)
		}
	}
	return found
}

// writes inserts a row through the cluster's multi-host URL and returns
// the rows the table holds.
func writes(t *testing.T, c *hapg.Cluster, value int) int {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS t (v int)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO t VALUES ($1)`, value)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	return n
}

func TestAClusterSurvivesASwitchoverAndItsPrimarysDeath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := start(t, hapg.Config{})
	first, err := c.Primary(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, writes(t, c, 1))

	second, err := c.Switchover(ctx)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	require.Equal(t, 2, writes(t, c, 2), "the synchronous standby had the row")

	third, err := c.KillPrimary(ctx)
	require.NoError(t, err)
	require.Equal(t, first, third)
	require.Equal(t, 3, writes(t, c, 3), "the synchronous standby had both rows")
}

// A primary whose postmaster dies while its Patroni lives fails over, and
// the old primary comes back as the standby of the new one.
func TestACrashedPrimaryFailsOverAndFollows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := start(t, hapg.Config{})
	first, err := c.Primary(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, writes(t, c, 1))

	second, err := c.CrashPrimary(ctx)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	require.Equal(t, 2, writes(t, c, 2), "the synchronous standby had the row")
}

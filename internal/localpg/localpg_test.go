package localpg_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestStartRestartStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))

	cluster, err := localpg.Start(ctx, localpg.Config{}, logger)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Not t.Context: it is canceled before cleanups run, and Stop would kill.
		require.NoError(t, cluster.Stop(context.Background()))
	})

	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE survives (n int); INSERT INTO survives VALUES (42)")
	require.NoError(t, err)

	require.NoError(t, cluster.Restart(ctx))

	// The outage broke the old connection.
	require.Error(t, conn.Ping(ctx))
	_ = conn.Close(ctx)

	conn, err = pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT n FROM survives").Scan(&n))
	require.Equal(t, 42, n)
}

func TestStopRemovesTemporaryDirectory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	cluster, err := localpg.Start(ctx, localpg.Config{}, nil)
	require.NoError(t, err)
	var dir string
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir))
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, cluster.Stop(ctx))
	require.NoError(t, cluster.Stop(ctx), "second Stop")
	_, err = os.Stat(filepath.Dir(dir))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestMissingBinaries(t *testing.T) {
	t.Parallel()

	_, err := localpg.Start(t.Context(), localpg.Config{BinDir: t.TempDir()}, nil)
	require.True(t, errors.Is(err, localpg.ErrNotInstalled), "got %v", err)
}

// A crash of the postmaster is recovered from the WAL: what was committed
// survives, what was not is gone, and every connection broke.
func TestCrashRecovers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster := startDurable(t)

	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE survives (n int); INSERT INTO survives VALUES (42)")
	require.NoError(t, err)
	open, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	tx, err := open.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO survives VALUES (7)")
	require.NoError(t, err)

	require.NoError(t, cluster.Crash(ctx), "crash recovery shows in the server log")

	require.Error(t, conn.Ping(ctx))
	require.Error(t, tx.Commit(ctx), "a transaction open at the crash cannot commit")
	_ = conn.Close(ctx)
	_ = open.Close(ctx)
	conn, err = pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var ns []int
	rows, err := conn.Query(ctx, "SELECT n FROM survives ORDER BY n")
	require.NoError(t, err)
	ns, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{42}, ns)
	require.NoError(t, cluster.Crash(ctx), "a second crash, on a recovered server")
}

// A backend busy computing does not notice its postmaster's death (it
// looks only while it waits), and keeps the old shared memory attached,
// which a new postmaster refuses to start beside: Crash waits for it, then
// kills it.
func TestCrashOutlivesABusyBackend(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster := startDurable(t)

	busy, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = busy.Close(context.Background()) })
	var pid int
	require.NoError(t, busy.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	go func() { _, _ = busy.Exec(ctx, "SELECT count(*) FROM generate_series(1, 10000000000)") }()
	require.Eventually(t, func() bool {
		conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var state string
		err = conn.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
		return err == nil && state == "active"
	}, 10*time.Second, 20*time.Millisecond, "the busy query is running")

	require.NoError(t, cluster.Crash(ctx))
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
}

// startDurable starts a durable cluster (one that can crash and recover)
// for the test.
func startDurable(t *testing.T) *localpg.Cluster {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	cluster, err := localpg.Start(t.Context(), localpg.Config{Durable: true}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Stop(context.Background())) })
	return cluster
}

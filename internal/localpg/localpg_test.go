package localpg_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

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

package dev_test

import (
	"bytes"
	"cmp"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/testenv"
)

// Without a PostgreSQL installation (an empty PostgresBinDir here) and
// without a Docker engine, Start says in one line what to install.
func TestStartWithoutPostgresSaysWhatToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no docker either
	_, err := dev.Start(t.Context(), dev.Config{PostgresBinDir: t.TempDir()}, testLogger(t))
	require.Error(t, err)
	require.Contains(t, err.Error(), "install PostgreSQL")
	require.Contains(t, err.Error(), "or Docker")
	require.NotContains(t, err.Error(), "\n")
}

// Without a PostgreSQL installation but with a Docker engine, Start runs
// PostgreSQL in a container of POSTGRES_IMAGE (the official image, or the
// stand-in of make demo-images), says so, and Stop removes it. .ci/run runs
// it on the stand-ins (TEST_CONTAINERS=on).
func TestStartRunsPostgresInAContainerWithoutAnInstallation(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs PostgreSQL in a Docker container")
	}
	image := cmp.Or(os.Getenv("POSTGRES_IMAGE"), dev.DefaultPostgresImage)
	choice, err := testenv.ChooseContainers(t.Context(), image)
	require.NoError(t, err)
	if !choice.Use {
		t.Skip("no containers: " + choice.Reason)
	}
	var log syncBuffer
	e, err := dev.Start(t.Context(), dev.Config{PostgresBinDir: t.TempDir(), PostgresImage: image}, slog.New(slog.NewTextHandler(&log, nil)))
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, e.Stop(context.Background()))
		}
	})
	require.Contains(t, log.String(), "PostgreSQL runs in a Docker container")
	require.Contains(t, log.String(), image)
	_, err = dev.Seed(t.Context(), e)
	require.NoError(t, err, "the services run on the container's databases")

	require.NoError(t, e.Stop(context.Background()))
	stopped = true
	out, err := exec.Command("docker", "ps", "-a", "-q", "--filter", "label=org.onceflow.dev=postgres").CombinedOutput()
	require.NoError(t, err)
	require.Empty(t, strings.TrimSpace(string(out)), "Stop leaves the container behind")
}

// syncBuffer is a log's buffer that the services write while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

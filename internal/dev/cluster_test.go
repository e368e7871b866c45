package dev_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestCluster runs dev as `onceflow dev --cluster 3` does: three
// nats-server processes with R3 streams. Orders are confirmed; the node
// leading the ORDERS stream is killed with SIGKILL, as a user would by its
// pid file, and an order placed meanwhile is confirmed all the same; the
// node is started again.
func TestCluster(t *testing.T) {
	t.Parallel()
	cfg := onServer(t, "cluster")
	cfg.ClusterNodes, cfg.NATSNodeCommand = 3, []string{buildNATSServer(t)}
	ctx := t.Context()
	e, err := dev.Start(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	require.Len(t, e.NATSNodes, 3)
	require.Len(t, strings.Split(e.NATSURL, ","), 3)
	_, err = dev.Seed(ctx, e)
	require.NoError(t, err)
	requireStatus(t, e, placeOrder(t, e, "alice", "apple", 1), "CONFIRMED")

	nc, err := nats.Connect(e.NATSURL, natsauth.Client{Creds: e.NATSCreds[streams.Operator]}.Options(streams.Operator)...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	s, err := js.Stream(ctx, streams.Orders)
	require.NoError(t, err)
	info := s.CachedInfo()
	require.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	var victim *dev.NATSNode
	for _, n := range e.NATSNodes {
		if n.Name == info.Cluster.Leader {
			victim = n
		}
	}
	require.NotNil(t, victim, "leader %q", info.Cluster.Leader)
	pid := readPID(t, victim.PIDFile)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	requireStatus(t, e, placeOrder(t, e, "alice", "pear", 1), "CONFIRMED")
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(victim.PIDFile)
		if err != nil {
			return false
		}
		again, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && again != pid && syscall.Kill(again, 0) == nil
	}, time.Minute, 100*time.Millisecond, "the killed node was not started again")
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return pid
}

// buildNATSServer builds the nats-server of go.mod, as onceflow's own
// nats-server command runs it, and as e2e and the stand-ins build it (no
// cgo, -trimpath), so that they compile it once.
func buildNATSServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

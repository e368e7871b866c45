package streams_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The same topology runs unchanged on a 3-node cluster with R3 streams:
// only Config.Replicas differs.
func TestProvisionOnAThreeNodeClusterWithR3(t *testing.T) {
	t.Parallel()
	urls := startCluster(t, 3)
	nc, err := nats.Connect(strings.Join(urls, ","))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := t.Context()

	topology := streams.Saga(streams.Config{Replicas: 3})
	// Right after start-up the cluster may still be electing its meta leader.
	// On a loaded machine that takes a while: every stream and durable is
	// a Raft group of its own.
	deadline := time.Now().Add(90 * time.Second)
	err = streams.Provision(ctx, js, topology)
	for err != nil && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		err = streams.Provision(ctx, js, topology)
	}
	require.NoError(t, err, "provision on the cluster")
	require.NoError(t, streams.Provision(ctx, js, topology), "idempotent on a cluster too")

	for _, name := range []string{streams.Orders, streams.Payments, streams.Inventory, streams.DLQ} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, info.Config.Replicas, name)
		require.NotNil(t, info.Cluster, name)
		require.Len(t, info.Cluster.Replicas, 2, "%s: a leader and two replicas", name)
	}
	for _, c := range topology.Consumers {
		cons, err := js.Consumer(ctx, c.Stream, c.Durable)
		require.NoError(t, err)
		require.Equal(t, 3, cons.CachedInfo().Config.Replicas, c.Durable)
	}
}

// startCluster starts n embedded JetStream servers routed into one cluster
// and returns their client URLs.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	routePorts := testenv.FreePorts(t, n)
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	urls := make([]string, n)
	for i := range n {
		srv, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster: server.ClusterOpts{
				Name: "onceflow-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
			NoLog:  true,
			NoSigs: true,
		})
		require.NoError(t, err)
		srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		require.True(t, srv.ReadyForConnections(10*time.Second))
		urls[i] = srv.ClientURL()
	}
	return urls
}

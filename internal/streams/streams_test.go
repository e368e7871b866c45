package streams_test

import (
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestProvisionIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	topology := streams.Saga(streams.Config{DuplicateWindow: 5 * time.Minute, MaxAge: time.Hour})

	require.NoError(t, streams.Provision(ctx, js, topology))
	_, err := js.Publish(ctx, "orders.placed.v1", []byte("{}"), jetstream.WithMsgID("m1"))
	require.NoError(t, err)
	require.NoError(t, streams.Provision(ctx, js, topology), "a second start changes nothing")

	for _, name := range []string{streams.Orders, streams.Payments, streams.Inventory, streams.DLQ} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
		cfg := s.CachedInfo().Config
		require.Equal(t, jetstream.FileStorage, cfg.Storage, name)
		require.Equal(t, 5*time.Minute, cfg.Duplicates, name)
		require.Equal(t, 1, cfg.Replicas, name)
	}
	orders, err := js.Stream(ctx, streams.Orders)
	require.NoError(t, err)
	info, err := orders.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "provisioning again keeps the messages")
	require.Equal(t, time.Hour, info.Config.MaxAge)

	for _, c := range topology.Consumers {
		cons, err := js.Consumer(ctx, c.Stream, c.Durable)
		require.NoError(t, err, c.Durable)
		cfg := cons.CachedInfo().Config
		require.Equal(t, jetstream.AckExplicitPolicy, cfg.AckPolicy, c.Durable)
		require.Positive(t, cfg.MaxDeliver, c.Durable)
		require.Equal(t, c.Durable, cfg.Durable)
	}
	placed, err := js.Consumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
	pending, err := placed.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), pending.NumPending, "the durable kept its position")
}

func TestProvisionUpdatesAChangedTopology(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{})))
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{DuplicateWindow: 10 * time.Minute})))
	s, err := js.Stream(ctx, streams.Payments)
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, s.CachedInfo().Config.Duplicates)
}

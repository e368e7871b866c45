package streams_test

import (
	"os"
	"slices"
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
		require.Equal(t, -1, cfg.MaxDeliver, "%s: the server never gives up on a message; the inbox does", c.Durable)
		require.Equal(t, "10", cfg.Metadata[streams.MetadataMaxDeliver], c.Durable)
		require.Equal(t, c.Durable, cfg.Durable)
	}
	// The DLQ: a budget per durable, all of which it has room for.
	s, err := js.Stream(ctx, streams.DLQ)
	require.NoError(t, err)
	dlqCfg := s.CachedInfo().Config
	require.Equal(t, int64(1000), dlqCfg.MaxMsgsPerSubject)
	require.True(t, dlqCfg.DiscardNewPerSubject)
	require.Equal(t, jetstream.DiscardNew, dlqCfg.Discard)
	require.Equal(t, int32(16<<10), dlqCfg.MaxMsgSize)
	require.GreaterOrEqual(t, dlqCfg.MaxBytes, int64(len(topology.Consumers))*dlqCfg.MaxMsgsPerSubject*int64(dlqCfg.MaxMsgSize))

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

func TestReplaySubjects(t *testing.T) {
	t.Parallel()
	subject := streams.ReplaySubject("payments.debited.v1", streams.InventoryPayments)
	require.Equal(t, "payments.debited.v1.replay.inventory-payments", subject)
	original, durable, ok := streams.ReplayOf(subject)
	require.True(t, ok)
	require.Equal(t, "payments.debited.v1", original)
	require.Equal(t, streams.InventoryPayments, durable)
	require.Equal(t, subject, streams.ReplaySubject(subject, streams.InventoryPayments), "a replay of a replay goes where the first went")
	for _, s := range []string{"payments.debited.v1", "payments.replay", ".replay.x", "a.replay.", "a.replay.b.c"} {
		_, _, ok := streams.ReplayOf(s)
		require.False(t, ok, s)
	}
}

// A replay reaches the durable it names and no other subscriber of the
// stream, and each durable records its service's inbox retention.
func TestReplayReachesOneDurable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	topology := streams.Saga(streams.Config{Storage: jetstream.MemoryStorage, InboxRetention: 48 * time.Hour})
	require.NoError(t, streams.Provision(ctx, js, topology))

	// PaymentDebited goes to inventory and order; its replay to inventory only.
	_, err := js.Publish(ctx, "payments.debited.v1", []byte("{}"))
	require.NoError(t, err)
	_, err = js.Publish(ctx, streams.ReplaySubject("payments.debited.v1", streams.InventoryPayments), []byte("{}"))
	require.NoError(t, err)
	pending := func(durable string) uint64 {
		cons, err := js.Consumer(ctx, streams.Payments, durable)
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, "48h0m0s", info.Config.Metadata[streams.MetadataInboxRetention], durable)
		return info.NumPending
	}
	require.Equal(t, uint64(2), pending(streams.InventoryPayments))
	require.Equal(t, uint64(1), pending(streams.OrderPayments))

	for _, c := range topology.Consumers {
		for _, f := range c.FilterSubjects {
			require.NotContains(t, f, ">", "%s: a wildcard filter would match other durables' replays", c.Durable)
		}
	}
}

// The operator's redelivery settings reach every durable, and a restart
// with other settings updates the durables in place.
func TestProvisionAppliesTheConsumerSettings(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{})))
	// A durable an earlier release provisioned gave up on the server's
	// side, after MaxDeliver deliveries; provisioning takes that away.
	old, err := js.Consumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
	oldCfg := old.CachedInfo().Config
	oldCfg.MaxDeliver, oldCfg.Metadata = 10, nil
	_, err = js.UpdateConsumer(ctx, streams.Orders, oldCfg)
	require.NoError(t, err)
	backOff := []time.Duration{2 * time.Second, 5 * time.Second, 20 * time.Second}
	topology := streams.Saga(streams.Config{AckWait: 45 * time.Second, MaxDeliver: 7})
	require.NoError(t, streams.Provision(ctx, js, topology))
	for _, c := range topology.Consumers {
		cons, err := js.Consumer(ctx, c.Stream, c.Durable)
		require.NoError(t, err, c.Durable)
		cfg := cons.CachedInfo().Config
		require.Equal(t, 45*time.Second, cfg.AckWait, c.Durable)
		require.Equal(t, -1, cfg.MaxDeliver, c.Durable)
		require.Equal(t, "7", cfg.Metadata[streams.MetadataMaxDeliver], c.Durable)
		require.Empty(t, cfg.BackOff, c.Durable)
	}

	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{MaxDeliver: 7, BackOff: backOff})))
	cons, err := js.Consumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
	cfg := cons.CachedInfo().Config
	require.Equal(t, backOff, cfg.BackOff)
	require.Equal(t, backOff[0], cfg.AckWait, "the server waits the first back-off for the first ack")

	own := streams.Topology{
		Config:    streams.Config{AckWait: 45 * time.Second},
		Consumers: []streams.Consumer{{Stream: streams.Orders, Durable: "own", FilterSubjects: []string{"orders.placed.v1"}, AckWait: 3 * time.Second}},
	}
	require.NoError(t, streams.Provision(ctx, js, own))
	cons, err = js.Consumer(ctx, streams.Orders, "own")
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, cons.CachedInfo().Config.AckWait, "a consumer's own setting wins")
}

// Every identity's permissions follow from the topology, for a service
// added to it (as `onceflow new service` adds one) as for the saga's: a
// consumer publishes its durables' dead letters and no other's, an owner
// its stream's subjects but not their replay subjects, and the operator
// those replay subjects but not the JetStream API of anyone's durable.
func TestPermissionsFollowTheTopology(t *testing.T) {
	t.Parallel()
	topology := streams.Saga(streams.Config{})
	topology.Streams = append(topology.Streams, streams.Stream{Name: "SHIPPING", Subjects: []string{"shipping.>"}, Owner: "shipping"})
	topology.Consumers = append(topology.Consumers,
		streams.Consumer{Stream: streams.Orders, Durable: "shipping-orders", Service: "shipping", FilterSubjects: []string{"orders.confirmed.v1"}},
		streams.Consumer{Stream: "SHIPPING", Durable: "notify-shipping", Service: "notify", FilterSubjects: []string{"shipping.sent.v1"}},
	)

	notify := topology.Permissions("notify")
	require.ElementsMatch(t, []string{
		"$JS.API.INFO",
		"$JS.API.CONSUMER.INFO.ORDERS.notify-orders", "$JS.API.CONSUMER.MSG.NEXT.ORDERS.notify-orders",
		"$JS.ACK.ORDERS.notify-orders.>", "$JS.ACK.*.*.ORDERS.notify-orders.>", "dlq.notify-orders",
		"$JS.API.CONSUMER.INFO.SHIPPING.notify-shipping", "$JS.API.CONSUMER.MSG.NEXT.SHIPPING.notify-shipping",
		"$JS.ACK.SHIPPING.notify-shipping.>", "$JS.ACK.*.*.SHIPPING.notify-shipping.>", "dlq.notify-shipping",
	}, notify.Publish)
	require.Empty(t, notify.DenyPublish, "notify owns no stream")
	require.Equal(t, []string{"_INBOX_notify.>"}, notify.Subscribe, "its own replies, and no advisory")

	shipping := topology.Permissions("shipping")
	require.Contains(t, shipping.Publish, "shipping.>")
	require.Contains(t, shipping.Publish, "dlq.shipping-orders")
	require.NotContains(t, shipping.Publish, "dlq.notify-shipping")
	require.Equal(t, []string{"shipping.sent.v1.replay.notify-shipping"}, shipping.DenyPublish)

	order := topology.Permissions("order")
	require.Contains(t, order.Publish, "orders.>")
	var onOrders []string // every replay subject on ORDERS
	for _, c := range topology.Consumers {
		for _, f := range c.FilterSubjects {
			if c.Stream == streams.Orders {
				onOrders = append(onOrders, f+".replay."+c.Durable)
			}
		}
	}
	require.Contains(t, onOrders, "orders.placed.v1.replay.payment-orders")
	require.Contains(t, onOrders, "orders.confirmed.v1.replay.shipping-orders")
	require.Contains(t, onOrders, "orders.expired.v1.replay.payment-expiries")
	require.ElementsMatch(t, onOrders, order.DenyPublish)

	operator := topology.Permissions(streams.Operator)
	for _, r := range topology.ReplaySubjects() {
		require.Contains(t, operator.Publish, r)
		require.NotContains(t, order.Publish, r)
	}
	for _, s := range topology.AllStreams() {
		for _, subject := range []string{
			"$JS.API.CONSUMER.CREATE." + s.Name, "$JS.API.CONSUMER.CREATE." + s.Name + ".mine",
			"$JS.API.CONSUMER.CREATE." + s.Name + ".mine.orders.placed.v1", "$JS.API.CONSUMER.DURABLE.CREATE." + s.Name + ".mine",
			"$JS.API.CONSUMER.DELETE." + s.Name + ".payment-orders", "$JS.API.CONSUMER.MSG.NEXT." + s.Name + ".payment-orders",
		} {
			require.False(t, slices.ContainsFunc(operator.Publish, func(a string) bool { return streams.SubjectMatches(a, subject) }),
				"the operator creates, deletes and pulls from no consumer: %s", subject)
		}
	}
	for _, p := range []streams.Permissions{operator, topology.Permissions(streams.Provisioner), topology.Permissions("nobody")} {
		require.Empty(t, p.DenyPublish)
	}
	require.Equal(t, []string{"$JS.API.INFO"}, topology.Permissions("nobody").Publish)
}

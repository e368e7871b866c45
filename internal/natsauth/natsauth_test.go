package natsauth_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/streamscan"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// violations records the permissions violations the server reports to a
// connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

// refused waits until the server has reported a violation naming subject.
func (v *violations) refused(t *testing.T, subject string) {
	t.Helper()
	require.Eventually(t, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, e := range v.errs {
			if strings.Contains(e, "ermissions") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no permissions violation for %s", subject)
}

// provisioned returns a NATS server with the saga's topology provisioned
// by the provisioner identity.
func provisioned(t *testing.T) (*testenv.NATS, streams.Topology) {
	t.Helper()
	n := testenv.NewNATS(t)
	topology := streams.Saga(streams.Config{})
	require.NoError(t, natsauth.Provision(t.Context(), n.Client(streams.Provisioner), topology))
	return n, topology
}

// as connects to n as identity, recording violations.
func as(t *testing.T, n *testenv.NATS, identity string) (jetstream.JetStream, *violations) {
	t.Helper()
	v := &violations{}
	js, err := jetstream.New(n.ConnAs(t, identity, nats.ErrorHandler(v.handler)))
	require.NoError(t, err)
	return js, v
}

func TestIdentitiesHaveTheTopologysPermissionsOnly(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	require.True(t, n.Embedded(), "the permissions need testenv's embedded server")
	ctx := t.Context()

	_, err := nats.Connect(n.URL, nats.MaxReconnects(0))
	require.Error(t, err, "an anonymous connection is refused")

	provisioner, pv := as(t, n, streams.Provisioner)
	topology := streams.Saga(streams.Config{})
	require.NoError(t, streams.Provision(ctx, provisioner, topology))
	require.NoError(t, streams.Provision(ctx, provisioner, topology), "idempotent")
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }
	pctx, cancel := short()
	defer cancel()
	_, err = provisioner.Publish(pctx, "orders.placed.v1", []byte("{}"))
	require.Error(t, err)
	pv.refused(t, "orders.placed.v1")

	payment, v := as(t, n, "payment")
	_, err = payment.Publish(ctx, "payments.debited.v1", []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
	require.NoError(t, err, "its own subject")
	for _, subject := range []string{"orders.placed.v1", "orders.confirmed.v1", "inventory.rejected.v1", "dlq.order-payments"} {
		pctx, cancel := short()
		_, err = payment.Publish(pctx, subject, []byte("{}"))
		cancel()
		require.Error(t, err, subject)
		v.refused(t, subject)
	}
	dctx, cancel := short()
	defer cancel()
	require.Error(t, payment.DeleteStream(dctx, streams.Orders))
	v.refused(t, "$JS.API.STREAM.DELETE.ORDERS")

	// Its own durable it can pull from and ack.
	cons, err := payment.Consumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
	admin := n.JetStream(t)
	_, err = admin.Publish(ctx, "orders.placed.v1", []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for msg := range batch.Messages() {
		require.NoError(t, msg.DoubleAck(ctx))
	}
	require.NoError(t, batch.Error())
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.AckFloor.Stream, "acked")
	// It reads nothing else of the stream: the inbox never reads a message
	// back (package inbox, exhausted.go).
	sctx, cancel := short()
	_, err = payment.Stream(sctx, streams.Orders)
	cancel()
	require.Error(t, err)
	v.refused(t, "$JS.API.STREAM.INFO.ORDERS")

	// Another service's durable it cannot.
	cctx, cancel := short()
	defer cancel()
	_, err = payment.Consumer(cctx, streams.Payments, streams.InventoryPayments)
	require.Error(t, err)
	v.refused(t, "$JS.API.CONSUMER.INFO.PAYMENTS.inventory-payments")
}

// publishRefused publishes on subject as js and requires the server to
// refuse it.
func publishRefused(t *testing.T, js jetstream.JetStream, v *violations, subject string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := js.Publish(ctx, subject, []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
	require.Error(t, err, subject)
	v.refused(t, subject)
}

// The replay subjects are the operator's: a stream's owner, whose
// permission covers the stream's subjects, may not publish them, and no
// service may publish another durable's dead letters.
func TestReplaySubjectsAreTheOperatorsAlone(t *testing.T) {
	t.Parallel()
	n, topology := provisioned(t)
	ctx := t.Context()

	for _, c := range topology.Consumers {
		owner := topology.Owner(c.FilterSubjects[0])
		js, v := as(t, n, owner)
		_, err := js.Publish(ctx, c.FilterSubjects[0], []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
		require.NoError(t, err, "%s publishes its own subject", owner)
		for _, f := range c.FilterSubjects {
			publishRefused(t, js, v, streams.ReplaySubject(f, c.Durable))
		}
	}
	operator, _ := as(t, n, streams.Operator)
	for _, r := range topology.ReplaySubjects() {
		_, err := operator.Publish(ctx, r, []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
		require.NoError(t, err, r)
	}

	// notify consumes notify-orders only: payment's dead letters are not its
	// to write.
	notify, v := as(t, n, "notify")
	_, err := notify.Publish(ctx, streams.DLQSubjectPrefix+streams.NotifyOrders, []byte("{}"))
	require.NoError(t, err)
	for _, c := range topology.Consumers {
		if c.Service != "notify" {
			publishRefused(t, notify, v, streams.DLQSubjectPrefix+c.Durable)
		}
	}
}

// The operator reads, pauses and replays, but cannot delete, recreate or
// pull from a service's durable.
func TestTheOperatorCannotTakeAServicesDurable(t *testing.T) {
	t.Parallel()
	n, topology := provisioned(t)
	ctx := t.Context()
	admin := n.JetStream(t)
	_, err := admin.Publish(ctx, "orders.placed.v1", []byte("{}"), jetstream.WithMsgID(uuid.NewString()))
	require.NoError(t, err)

	operator, v := as(t, n, streams.Operator)
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }
	for _, c := range topology.Consumers {
		name := c.Stream + "." + c.Durable
		dctx, cancel := short()
		require.Error(t, operator.DeleteConsumer(dctx, c.Stream, c.Durable), c.Durable)
		cancel()
		v.refused(t, "$JS.API.CONSUMER.DELETE."+name)

		cctx, cancel := short()
		_, err := operator.CreateOrUpdateConsumer(cctx, c.Stream, jetstream.ConsumerConfig{
			Durable: c.Durable, AckPolicy: jetstream.AckNonePolicy, FilterSubject: c.FilterSubjects[0],
		})
		cancel()
		require.Error(t, err, c.Durable)
		v.refused(t, "$JS.API.CONSUMER.CREATE."+name+"."+c.FilterSubjects[0])
	}

	// It sees the durable, but a pull from it is refused.
	cons, err := operator.Consumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
	batch, err := cons.FetchNoWait(1)
	require.NoError(t, err)
	for range batch.Messages() {
		t.Fatal("the operator pulled a message from payment-orders")
	}
	v.refused(t, "$JS.API.CONSUMER.MSG.NEXT.ORDERS."+streams.PaymentOrders)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.NumPending, "the message is still the service's")
	require.Zero(t, info.NumAckPending)
	for _, c := range topology.Consumers {
		_, err := admin.Consumer(ctx, c.Stream, c.Durable)
		require.NoError(t, err, "%s is still there", c.Durable)
	}

	// What the operator is for still works: reading the stream, pausing a
	// durable, publishing a replay subject.
	st, err := operator.Stream(ctx, streams.Orders)
	require.NoError(t, err)
	var read []string
	require.NoError(t, streamscan.Scan(ctx, st, streamscan.Range{}, func(m streamscan.Message) bool {
		read = append(read, m.Subject)
		return true
	}))
	require.Equal(t, []string{"orders.placed.v1"}, read)
	_, err = operator.PauseConsumer(ctx, streams.Orders, streams.PaymentOrders, time.Now().Add(time.Minute))
	require.NoError(t, err)
	_, err = operator.ResumeConsumer(ctx, streams.Orders, streams.PaymentOrders)
	require.NoError(t, err)
}

// The operator creates no consumer of any kind: a push consumer of its own
// would have the server deliver whatever it can write (a dlqactions entry
// shaped as an advisory, a stream's events) onto any subject it names, past
// every permission — the forged MAX_DELIVERIES advisory that once made
// payment dead-letter an event it had processed. Nor may it publish on the
// server's advisory subjects, and no service subscribes to one.
func TestTheOperatorCannotForgeAnAdvisoryOrDeliverOntoOthersSubjects(t *testing.T) {
	t.Parallel()
	n, topology := provisioned(t)
	ctx := t.Context()
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }

	operator, v := as(t, n, streams.Operator)
	const advisory = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS." + streams.PaymentOrders
	for _, stream := range []string{streams.DLQActions, streams.Orders} {
		for _, deliver := range []string{advisory, streams.InboxPrefix("payment") + ".guessed", "orders.placed.v1"} {
			cctx, cancel := short()
			_, err := operator.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{
				Name: "forger", DeliverSubject: deliver, AckPolicy: jetstream.AckNonePolicy,
			})
			cancel()
			require.Error(t, err, "a push consumer on %s delivering onto %s", stream, deliver)
			v.refused(t, "$JS.API.CONSUMER.CREATE."+stream+".forger")
		}
		cctx, cancel := short()
		_, err := operator.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{Name: "reader", AckPolicy: jetstream.AckNonePolicy})
		cancel()
		require.Error(t, err, "a pull consumer of its own on %s", stream)
		v.refused(t, "$JS.API.CONSUMER.CREATE."+stream+".reader")
	}
	nc := n.ConnAs(t, streams.Operator, nats.ErrorHandler(v.handler))
	require.NoError(t, nc.Publish(advisory, []byte(`{"stream":"ORDERS","consumer":"payment-orders","stream_seq":1,"deliveries":10}`)))
	require.NoError(t, nc.Flush())
	v.refused(t, advisory)

	for _, service := range topology.Services() {
		require.Equal(t, []string{streams.InboxPrefix(service) + ".>"}, topology.Permissions(service).Subscribe,
			"%s subscribes to its own replies only", service)
	}
}

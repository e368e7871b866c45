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

	"github.com/onceflow/onceflow/internal/streams"
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

	// Another service's durable it cannot.
	cctx, cancel := short()
	defer cancel()
	_, err = payment.Consumer(cctx, streams.Payments, streams.InventoryPayments)
	require.Error(t, err)
	v.refused(t, "$JS.API.CONSUMER.INFO.PAYMENTS.inventory-payments")
}

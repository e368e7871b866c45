package payment_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/payment"
)

// orderExpired is the OrderExpired of the order of placed; each call is a
// new event, as a re-emitted one would be.
func orderExpired(t *testing.T, placed event.Envelope) event.Envelope {
	t.Helper()
	var p event.OrderPlacedV1
	require.NoError(t, placed.Decode(&p))
	ev, err := event.New("order", event.OrderExpired, placed.Subject, event.OrderExpiredV1{
		Order: p.Order, Deadline: time.Now().UTC(), Status: "PENDING", TotalCents: p.TotalCents,
	})
	require.NoError(t, err)
	return ev
}

// awaitPayment waits until the payment of the order of placed has status.
func awaitPayment(t *testing.T, svc *apptest.Service, placed event.Envelope, status string) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, _ := paymentOf(t, svc, placed)
		return got == status
	}, 20*time.Second, 20*time.Millisecond, "the payment never became %s", status)
}

// TestAnExpiredOrderIsRefundedOnce: an order debited before its
// OrderExpired reached payment is refunded, once, however many OrderExpired
// and StockRejected events come for it, in either order.
func TestAnExpiredOrderIsRefundedOnce(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "alice", 1000)
		refunds := svc.Watch(t, streams.Payments, "payments.refunded.v1")
		placed := orderPlaced(t, "alice", 300)
		svc.Publish(t, placed)
		awaitPayment(t, svc, placed, payment.StatusDebited)
		require.Equal(t, int64(700), balance(t, svc, "alice"))

		svc.Publish(t, orderExpired(t, placed))
		awaitPayment(t, svc, placed, payment.StatusRefunded)
		got := refunds.Wait(t, 1)
		require.Equal(t, placed.Subject, got[0].Subject)
		require.Equal(t, int64(1000), balance(t, svc, "alice"))

		// Another expiry (re-emitted) and the stock's refusal change nothing.
		svc.PublishAtOnce(t, orderExpired(t, placed), stockRejected(t, placed))
		require.Eventually(t, func() bool {
			return svc.InboxCount(t, streams.PaymentExpiries, "processed") == 2 && svc.InboxCount(t, streams.PaymentInventory, "processed") == 1
		}, 20*time.Second, 20*time.Millisecond)
		require.Len(t, refunds.Seen(), 1, "one refund")
		require.Equal(t, int64(1000), balance(t, svc, "alice"))
		var reason string
		require.NoError(t, svc.DB.Pool.QueryRow(t.Context(), `SELECT reason FROM payments WHERE order_id = $1`, uuid.MustParse(placed.Subject)).Scan(&reason))
		require.Equal(t, payment.ReasonOrderExpired, reason)
	})
}

// TestAnOrderExpiredBeforeItsPaymentIsNeverDebited: the OrderExpired
// overtakes the OrderPlaced (arranged: the OrderPlaced is published only
// once the expiry is recorded). The order gets an EXPIRED payment, and its
// OrderPlaced debits nothing and emits nothing.
func TestAnOrderExpiredBeforeItsPaymentIsNeverDebited(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "alice", 1000)
		outcomes := svc.Watch(t, streams.Payments, "payments.>")
		placed := orderPlaced(t, "alice", 300)
		svc.Publish(t, orderExpired(t, placed))
		awaitPayment(t, svc, placed, payment.StatusExpired)

		svc.Publish(t, placed)
		require.Eventually(t, func() bool {
			return svc.InboxCount(t, streams.PaymentOrders, "processed") == 1
		}, 20*time.Second, 20*time.Millisecond)
		status, n := paymentOf(t, svc, placed)
		require.Equal(t, payment.StatusExpired, status)
		require.Equal(t, 1, n)
		require.Equal(t, int64(1000), balance(t, svc, "alice"))
		require.Empty(t, outcomes.Seen(), "an expired order has no payment outcome")
	})
}

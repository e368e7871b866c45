package inventory_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
)

// orderExpired is the OrderExpired of the order of debited; each call is a
// new event, as a re-emitted one would be.
func orderExpired(t *testing.T, debited event.Envelope) event.Envelope {
	t.Helper()
	var p event.PaymentDebitedV1
	require.NoError(t, debited.Decode(&p))
	ev, err := event.New("order", event.OrderExpired, debited.Subject, event.OrderExpiredV1{
		Order: p.Order, Deadline: time.Now().UTC(), Status: "PAID", TotalCents: p.AmountCents,
	})
	require.NoError(t, err)
	return ev
}

// statusOf is the status of the reservation of the order of ev, "" for
// none.
func statusOf(t *testing.T, svc *apptest.Service, ev event.Envelope) string {
	t.Helper()
	var status string
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
		`SELECT coalesce(min(status), '') FROM reservations WHERE order_id = $1`, uuid.MustParse(ev.Subject)).Scan(&status))
	return status
}

func awaitReservation(t *testing.T, svc *apptest.Service, ev event.Envelope, status string) {
	t.Helper()
	require.Eventually(t, func() bool { return statusOf(t, svc, ev) == status },
		20*time.Second, 20*time.Millisecond, "the reservation never became %s", status)
}

// awaitProcessed waits until durable processed n events.
func awaitProcessed(t *testing.T, svc *apptest.Service, durable string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return svc.InboxCount(t, durable, "processed") == n },
		20*time.Second, 20*time.Millisecond, "%s did not process %d events", durable, n)
}

// TestAnExpiredOrdersReservationIsReleasedOnce: stock reserved before the
// order's OrderExpired reached inventory is given back, once, however many
// OrderExpired events come; the ledger still adds up.
func TestAnExpiredOrdersReservationIsReleasedOnce(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		setStock(t, svc, "apple", 10)
		setStock(t, svc, "pear", 5)
		debited := paymentDebited(t, line("apple", 3), line("pear", 2))
		svc.Publish(t, debited)
		awaitReservation(t, svc, debited, inventory.StatusReserved)
		require.Equal(t, int64(7), available(t, svc, "apple"))

		svc.PublishAtOnce(t, orderExpired(t, debited), orderExpired(t, debited))
		awaitProcessed(t, svc, streams.InventoryExpiries, 2)
		require.Equal(t, inventory.StatusReleased, statusOf(t, svc, debited))
		require.Equal(t, int64(10), available(t, svc, "apple"))
		require.Equal(t, int64(5), available(t, svc, "pear"))
	})
}

// TestAnOrderExpiredBeforeItsDebitReservesNothing: the OrderExpired
// overtakes the PaymentDebited (arranged: the debit is published once the
// expiry is recorded). The order gets an EXPIRED decision, and its
// PaymentDebited reserves nothing and emits nothing.
func TestAnOrderExpiredBeforeItsDebitReservesNothing(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		setStock(t, svc, "apple", 10)
		outcomes := svc.Watch(t, streams.Inventory, "inventory.>")
		debited := paymentDebited(t, line("apple", 3))
		svc.Publish(t, orderExpired(t, debited))
		awaitReservation(t, svc, debited, inventory.StatusExpired)

		svc.Publish(t, debited)
		awaitProcessed(t, svc, streams.InventoryPayments, 1)
		require.Equal(t, inventory.StatusExpired, statusOf(t, svc, debited))
		require.Equal(t, int64(10), available(t, svc, "apple"))
		require.Empty(t, outcomes.Seen(), "an expired order has no stock outcome")
	})
}

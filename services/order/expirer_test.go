package order_test

import (
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/services/order"
)

// awaitStatus waits until order id has status.
func awaitStatus(t *testing.T, svc *apptest.Service, id uuid.UUID, status string) order.Order {
	t.Helper()
	var o order.Order
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := fetch(t.Context(), svc, id)
		require.NoError(c, err)
		require.Equal(c, status, got.Status)
		o = got
	}, 20*time.Second, 20*time.Millisecond, "order %s never became %s", id, status)
	return o
}

// entry is the timeline entry of event type typ.
func entry(t *testing.T, o order.Order, typ event.Type) order.TimelineEntry {
	t.Helper()
	i := slices.IndexFunc(o.Timeline, func(e order.TimelineEntry) bool { return e.Type == typ })
	require.GreaterOrEqual(t, i, 0, "no %s in the timeline of order %s: %v", typ, o.ID, types(o.Timeline))
	return o.Timeline[i]
}

// expiredPayload is the OrderExpired of order id in the outbox, which must
// hold exactly one.
func expiredPayload(t *testing.T, svc *apptest.Service, id uuid.UUID) event.OrderExpiredV1 {
	t.Helper()
	require.Equal(t, 1, outboxed(t, svc, id, event.OrderExpired), "OrderExpired rows of order %s", id)
	var data []byte
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
		`SELECT data FROM outbox WHERE subject = $1 AND event_type = $2`, id.String(), string(event.OrderExpired)).Scan(&data))
	var p event.OrderExpiredV1
	require.NoError(t, json.Unmarshal(data, &p))
	return p
}

// pastDeadline moves the deadlines of ids into the past: the orders are due.
func pastDeadline(t *testing.T, svc *apptest.Service, ids ...uuid.UUID) {
	t.Helper()
	_, err := svc.DB.Pool.Exec(t.Context(), `UPDATE orders SET deadline = now() - interval '1 second' WHERE id = ANY ($1)`, ids)
	require.NoError(t, err)
}

// TestAnOrderExpiresAtItsDeadlineAndLateRepliesChangeNothing places an order
// whose deadline has passed by the time it is committed (a deadline of a
// microsecond): no reply can come first. The expirer ends it EXPIRED with
// one OrderExpired, and the replies that come after are recorded as late
// with their fates, changing nothing.
func TestAnOrderExpiresAtItsDeadlineAndLateRepliesChangeNothing(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := startOrder(t, order.Config{Deadline: time.Microsecond}, mode)
		placed := place(t, svc, "alice")
		require.NotNil(t, placed.Deadline)
		require.Equal(t, placed.CreatedAt.Add(time.Microsecond), *placed.Deadline)

		o := awaitStatus(t, svc, placed.ID, order.StatusExpired)
		require.Equal(t, order.ReasonDeadline, entry(t, o, event.OrderExpired).Reason)
		p := expiredPayload(t, svc, placed.ID)
		require.Equal(t, order.StatusPending, p.Status)
		require.Equal(t, placed.TotalCents, p.TotalCents)
		require.True(t, p.Deadline.Equal(*placed.Deadline))

		sg := saga{t, placed}
		for _, c := range []struct {
			ev   event.Envelope
			fate string
		}{
			{sg.debited(), order.LateRefunded},
			{sg.reserved(), order.LateReleased},
			{sg.paymentRejected("insufficient funds"), order.LateUnchanged},
			{sg.stockRejected("no pears"), order.LateUnchanged},
			{sg.refunded(), order.LateUnchanged},
		} {
			o = publishAndAwait(t, svc, placed.ID, c.ev)
			require.Equal(t, order.StatusExpired, o.Status)
			require.Equal(t, c.fate, entry(t, o, c.ev.Type).Late, "%s after expiry", c.ev.Type)
		}
		awaitOutboxSent(t, svc)
		require.Equal(t, 1, outboxed(t, svc, placed.ID, event.OrderExpired))
		for _, typ := range []event.Type{event.OrderConfirmed, event.OrderRejected, event.OrderCancelled} {
			require.Zero(t, outboxed(t, svc, placed.ID, typ), "%s of an expired order", typ)
		}
	})
}

// TestAPaidOrderExpiresWithItsStatus: an order the payment reached before
// its deadline expires PAID, and says so, for payment to refund.
func TestAPaidOrderExpiresWithItsStatus(t *testing.T) {
	t.Parallel()
	svc := start(t)
	placed := place(t, svc, "alice")
	o := publishAndAwait(t, svc, placed.ID, saga{t, placed}.debited())
	require.Equal(t, order.StatusPaid, o.Status)
	require.Empty(t, entry(t, o, event.PaymentDebited).Late)

	pastDeadline(t, svc, placed.ID)
	awaitStatus(t, svc, placed.ID, order.StatusExpired)
	require.Equal(t, order.StatusPaid, expiredPayload(t, svc, placed.ID).Status)
}

// TestExpirersSkipOrdersInUseAndExpireEachOrderOnce runs several expirers
// (the service's and three more, as replicas would) over due orders, one of
// which a transaction holds locked as an event handler would: the expirers
// skip it without waiting for it, expire every other order once, and expire
// it once it is released.
func TestExpirersSkipOrdersInUseAndExpireEachOrderOnce(t *testing.T) {
	t.Parallel()
	svc := start(t)
	var ids []uuid.UUID
	for range 30 {
		ids = append(ids, place(t, svc, "alice").ID)
	}
	// The held order is made due by the transaction that holds it, which
	// commits once the expirers have done what they could.
	held := ids[0]
	tx, err := svc.DB.Pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(t.Context()) })
	_, err = tx.Exec(t.Context(), `UPDATE orders SET deadline = now() - interval '1 second' WHERE id = $1`, held)
	require.NoError(t, err)

	pastDeadline(t, svc, ids[1:]...)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			e := order.NewExpirer(svc.DB.Pool, order.ExpirerConfig{BatchSize: 4}, slog.New(slog.DiscardHandler))
			for {
				n, err := e.ExpireDue(t.Context())
				if !assert.NoError(t, err) || n == 0 {
					return
				}
			}
		})
	}
	// Each replica returns once it finds nothing due it can lock: it never
	// waits for the held order.
	wg.Wait()
	for _, id := range ids[1:] {
		awaitStatus(t, svc, id, order.StatusExpired)
	}
	require.Equal(t, order.StatusPending, get(t, svc, held).Status)
	require.Zero(t, outboxed(t, svc, held, event.OrderExpired))

	require.NoError(t, tx.Commit(t.Context()))
	awaitStatus(t, svc, held, order.StatusExpired)
	for _, id := range ids {
		expiredPayload(t, svc, id)
		require.Equal(t, 1, countRows(t, svc, `SELECT 1 FROM order_timeline WHERE order_id = $1 AND event_type = $2`, id, string(event.OrderExpired)))
	}
}

package notify_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/notify"
)

// TestConformance runs the conformance kit against notify's handler, in
// each mode: each milestone (OrderPlaced, OrderConfirmed, OrderRejected,
// OrderCancelled, in turn) writes one e-mail to its order's customer, and
// so does an OrderExpired.
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(notify.Name)
	require.NoError(t, err)
	var made atomic.Int64 // events made, shared by every property's run
	conformance.Run(t, conformance.Service{
		Name:       notify.Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := notify.New(env.Pool)
			// A property runs one kind of event, so each type of the one
			// durable is an entry of its own; the kit names the second
			// notify-orders#01.
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.NotifyOrders: {{
					// The milestones in turn, one per call, across all the
					// kit's runs.
					NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
						o := newOrder()
						milestones := []struct {
							typ     event.Type
							payload any
						}{
							{event.OrderPlaced, event.OrderPlacedV1{Order: o, Lines: event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 120}}, TotalCents: 120}},
							{event.OrderConfirmed, event.OrderConfirmedV1{Order: o, TotalCents: 120}},
							{event.OrderRejected, event.OrderRejectedV1{Order: o, Reason: "payment rejected"}},
							{event.OrderCancelled, event.OrderCancelledV1{Order: o, Reason: "out of apple"}},
						}
						m := milestones[int(made.Add(1))%len(milestones)]
						ev, err := event.New("order", m.typ, o.OrderID.String(), m.payload)
						require.NoError(t, err)
						return ev
					},
					Effect: conformance.Count(`SELECT count(*)::int FROM notifications WHERE order_id = $1::uuid`, orderOf),
				}, {
					NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
						o := newOrder()
						ev, err := event.New("order", event.OrderExpired, o.OrderID.String(), event.OrderExpiredV1{
							Order: o, Deadline: time.Now().UTC(), Status: "PENDING", TotalCents: 120,
						})
						require.NoError(t, err)
						return ev
					},
					Effect: conformance.Count(`SELECT count(*)::int FROM notifications WHERE order_id = $1::uuid AND kind = 'expired'`, orderOf),
				}},
			})
		},
	})
}

// newOrder is a new order of a customer with an e-mail address.
func newOrder() event.Order {
	return event.Order{OrderID: uuid.Must(uuid.NewV7()), CustomerID: "alice", CustomerEmail: "alice@example.com"}
}

// orderOf is the order an event is about: its subject.
func orderOf(ev conformance.Event) any { return ev.Subject }

package order

import (
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestConformance runs the conformance kit against order's handlers as
// run.go wires them, in each mode, each event type of a durable in turn: a
// PaymentDebited moves a PENDING order to PAID, a PaymentRejected to
// REJECTED, a PaymentRefunded a PAID one to CANCELLED, a StockReserved a
// PAID one to CONFIRMED, and a StockRejected is recorded, each with one
// entry on the order's timeline. (An internal test: the subscriptions' handlers are
// the service's dispatchers.)
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(Name)
	require.NoError(t, err)
	var made atomic.Int64 // events made, shared by every property's run
	conformance.Run(t, conformance.Service{
		Name:       Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := New(env.Pool)
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.OrderPayments: {{
					// A debit or a rejection of a PENDING order, or the refund
					// of a PAID one, in turn across all the kit's runs.
					NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
						n := made.Add(1) % 3
						status := StatusPending
						if n == 2 {
							status = StatusPaid
						}
						o := placedOrder(t, env, status)
						typ, payload := event.PaymentDebited, any(event.PaymentDebitedV1{Order: o.Order, Lines: o.Lines, AmountCents: o.TotalCents})
						switch n {
						case 1:
							typ, payload = event.PaymentRejected, event.PaymentRejectedV1{Order: o.Order, AmountCents: o.TotalCents, Reason: "insufficient funds"}
						case 2:
							typ, payload = event.PaymentRefunded, event.PaymentRefundedV1{Order: o.Order, AmountCents: o.TotalCents}
						}
						ev, err := event.New("payment", typ, o.Order.OrderID.String(), payload)
						require.NoError(t, err)
						return ev
					},
					// Debits of one PENDING order: the first makes it PAID,
					// the others are recorded and change nothing, whichever
					// commits first.
					NewEvents: func(t testing.TB, env conformance.Env, n int) []conformance.Event {
						o := placedOrder(t, env, StatusPending)
						return ofOneOrder(t, n, o.OrderID, "payment", event.PaymentDebited, event.PaymentDebitedV1{Order: o.Order, Lines: o.Lines, AmountCents: o.TotalCents})
					},
					Effect: onTimeline,
				}},
				streams.OrderInventory: {{
					// A reservation or a refusal of a PAID order's stock, in
					// turn across all the kit's runs.
					NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
						o := placedOrder(t, env, StatusPaid)
						var payload any = event.StockReservedV1{Order: o.Order, Lines: o.Lines}
						typ := event.StockReserved
						if made.Add(1)%2 == 1 {
							typ, payload = event.StockRejected, event.StockRejectedV1{Order: o.Order, AmountCents: o.TotalCents, Reason: "out of apple"}
						}
						ev, err := event.New("inventory", typ, o.Order.OrderID.String(), payload)
						require.NoError(t, err)
						return ev
					},
					// Refusals of one PAID order's stock: each is recorded,
					// with its reason, and none moves the order.
					NewEvents: func(t testing.TB, env conformance.Env, n int) []conformance.Event {
						o := placedOrder(t, env, StatusPaid)
						return ofOneOrder(t, n, o.OrderID, "inventory", event.StockRejected, event.StockRejectedV1{Order: o.Order, AmountCents: o.TotalCents, Reason: "out of apple"})
					},
					Effect: onTimeline,
				}},
			})
		},
	})
}

// onTimeline counts an event's entries on its order's timeline.
var onTimeline = conformance.Count(`SELECT count(*)::int FROM order_timeline WHERE event_id = $1`,
	func(ev conformance.Event) any { return ev.ID })

// ofOneOrder is n events of type typ with payload, each with an id of its
// own, about one order: events that share their entity, the order's row,
// whose effects do not depend on the order in which they commit.
func ofOneOrder(t testing.TB, n int, order uuid.UUID, source string, typ event.Type, payload any) []conformance.Event {
	evs := make([]conformance.Event, n)
	for i := range evs {
		var err error
		evs[i], err = event.New(source, typ, order.String(), payload)
		require.NoError(t, err)
	}
	return evs
}

// placedOrder writes a new order with status, as POST /orders and the
// saga so far would have left it.
func placedOrder(t testing.TB, env conformance.Env, status string) event.OrderPlacedV1 {
	orderID := uuid.Must(uuid.NewV7())
	o := event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 2, UnitPriceCents: 120}},
		TotalCents: 240,
	}
	_, err := env.Pool.Exec(t.Context(),
		`INSERT INTO orders (id, customer_id, status, total_cents) VALUES ($1, $2, $3, $4)`,
		orderID, o.CustomerID, status, o.TotalCents)
	require.NoError(t, err)
	_, err = env.Pool.Exec(t.Context(),
		`INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents) VALUES ($1, 1, 'apple', 2, 120)`, orderID)
	require.NoError(t, err)
	return o
}

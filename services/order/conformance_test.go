package order

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestConformance runs the conformance kit against order's handlers as
// run.go wires them, in each mode: a PaymentDebited moves a PENDING order
// to PAID, a StockReserved a PAID one to CONFIRMED, each with one entry on
// the order's timeline. (An internal test: the subscriptions' handlers are
// the service's dispatchers.)
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := New(env.Pool)
			return []conformance.Subscription{{
				Stream: streams.Payments, Durable: streams.OrderPayments,
				Handler: s.handlePaymentEvent, BatchHandler: s.batchHandler(paymentTypes),
				NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
					o := placedOrder(t, env, StatusPending)
					ev, err := event.New("payment", event.PaymentDebited, o.Order.OrderID.String(), event.PaymentDebitedV1{
						Order: o.Order, Lines: o.Lines, AmountCents: o.TotalCents,
					})
					require.NoError(t, err)
					return ev
				},
				Effect: onTimeline,
			}, {
				Stream: streams.Inventory, Durable: streams.OrderInventory,
				Handler: s.handleInventoryEvent, BatchHandler: s.batchHandler(inventoryTypes),
				NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
					o := placedOrder(t, env, StatusPaid)
					ev, err := event.New("inventory", event.StockReserved, o.Order.OrderID.String(), event.StockReservedV1{
						Order: o.Order, Lines: o.Lines,
					})
					require.NoError(t, err)
					return ev
				},
				Effect: onTimeline,
			}}
		},
	})
}

// onTimeline counts an event's entries on its order's timeline.
var onTimeline = conformance.Count(`SELECT count(*)::int FROM order_timeline WHERE event_id = $1`,
	func(ev conformance.Event) any { return ev.ID })

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

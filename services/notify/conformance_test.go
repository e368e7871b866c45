package notify_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/notify"
)

// TestConformance runs the conformance kit against notify's handler, in
// each mode: an OrderPlaced writes one e-mail to its order's customer.
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(notify.Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       notify.Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := notify.New(env.Pool)
			return []conformance.Subscription{{
				Stream: streams.Orders, Durable: streams.NotifyOrders,
				Handler: s.HandleOrderMilestone, BatchHandler: s.HandleOrderMilestoneBatch,
				NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
					orderID := uuid.Must(uuid.NewV7())
					ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
						Order:      event.Order{OrderID: orderID, CustomerID: "alice", CustomerEmail: "alice@example.com"},
						Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 120}},
						TotalCents: 120,
					})
					require.NoError(t, err)
					return ev
				},
				Effect: conformance.Count(`SELECT count(*)::int FROM notifications WHERE order_id = $1::uuid`,
					func(ev conformance.Event) any { return ev.Subject }),
			}}
		},
	})
}

package inventory_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
)

// TestConformance runs the conformance kit against inventory's handler, in
// each mode: a PaymentDebited makes one reservation of its order.
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(inventory.Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       inventory.Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := inventory.New(env.Pool)
			return []conformance.Subscription{{
				Stream: streams.Payments, Durable: streams.InventoryPayments,
				Handler: s.HandlePaymentDebited, BatchHandler: s.HandlePaymentDebitedBatch,
				// A PaymentDebited of a new order of a product in stock.
				NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
					sku := "sku-" + uuid.NewString()
					_, err := env.Pool.Exec(t.Context(), `INSERT INTO stock (sku, available) VALUES ($1, 100)`, sku)
					require.NoError(t, err)
					orderID := uuid.Must(uuid.NewV7())
					ev, err := event.New("payment", event.PaymentDebited, orderID.String(), event.PaymentDebitedV1{
						Order:       event.Order{OrderID: orderID, CustomerID: "alice"},
						Lines:       event.Lines{{SKU: sku, Quantity: 2, UnitPriceCents: 125}},
						AmountCents: 250,
					})
					require.NoError(t, err)
					return ev
				},
				Effect: conformance.Count(`SELECT count(*)::int FROM reservations WHERE order_id = $1::uuid`,
					func(ev conformance.Event) any { return ev.Subject }),
			}}
		},
	})
}

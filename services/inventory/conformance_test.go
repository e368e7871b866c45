package inventory_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
)

// TestConformance runs the conformance kit against inventory's handlers, in
// each mode: a PaymentDebited makes one reservation of its order; an
// OrderExpired releases an order's reservation (RELEASED, its stock given
// back), once.
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(inventory.Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       inventory.Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := inventory.New(env.Pool)
			// debitedN is the PaymentDebited of n new orders of one new
			// product with just enough in stock for them all.
			debitedN := func(t testing.TB, env conformance.Env, n int) []conformance.Event {
				sku := "sku-" + uuid.NewString()
				_, err := env.Pool.Exec(t.Context(), `INSERT INTO stock (sku, available) VALUES ($1, $2)`, sku, 2*n)
				require.NoError(t, err)
				evs := make([]conformance.Event, n)
				for i := range evs {
					orderID := uuid.Must(uuid.NewV7())
					evs[i], err = event.New("payment", event.PaymentDebited, orderID.String(), event.PaymentDebitedV1{
						Order:       event.Order{OrderID: orderID, CustomerID: "alice"},
						Lines:       event.Lines{{SKU: sku, Quantity: 2, UnitPriceCents: 125}},
						AmountCents: 250,
					})
					require.NoError(t, err)
				}
				return evs
			}
			debited := func(t testing.TB, env conformance.Env) conformance.Event { return debitedN(t, env, 1)[0] }
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.InventoryPayments: {{
					NewEvent: debited, NewEvents: debitedN,
					Effect: conformance.Count(`SELECT count(*)::int FROM reservations WHERE order_id = $1::uuid`,
						func(ev conformance.Event) any { return ev.Subject }),
				}},
				streams.InventoryExpiries: {{
					// The OrderExpired of an order whose reservation holds its
					// product's whole stock, committed.
					NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
						ev := debited(t, env)
						tx, err := env.Pool.Begin(t.Context())
						require.NoError(t, err)
						require.NoError(t, s.HandlePaymentDebited(t.Context(), tx, ev))
						require.NoError(t, tx.Commit(t.Context()))
						var p event.PaymentDebitedV1
						require.NoError(t, ev.Decode(&p))
						expired, err := event.New("order", event.OrderExpired, ev.Subject, event.OrderExpiredV1{
							Order: p.Order, Deadline: time.Now().UTC(), Status: "PAID", TotalCents: p.AmountCents,
						})
						require.NoError(t, err)
						return expired
					},
					// The releases of the order: none until its reservation is
					// RELEASED, then as many as its quantity is back in stock,
					// which the reservation emptied; stock given back twice
					// counts 2.
					Effect: conformance.Count(`
						SELECT CASE r.status WHEN 'RELEASED' THEN s.available / l.quantity ELSE 0 END::int
						FROM reservations r JOIN reservation_lines l USING (order_id) JOIN stock s USING (sku)
						WHERE r.order_id = $1::uuid`,
						func(ev conformance.Event) any { return ev.Subject }),
				}},
			})
		},
	})
}

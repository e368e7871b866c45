package payment_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/payment"
)

// TestConformance runs the conformance kit against payment's handlers, in
// each mode: an OrderPlaced debits (one payment per order), a
// StockRejected refunds (the payment REFUNDED once), an OrderExpired
// refunds an order debited before (the payment REFUNDED and its amount
// back in the wallet, once).
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(payment.Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       payment.Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := payment.New(env.Pool)
			// placedN is n OrderPlaced of a new customer whose wallet holds
			// exactly their total.
			placedN := func(t testing.TB, env conformance.Env, n int) []conformance.Event {
				customer := "c-" + uuid.NewString()
				_, err := env.Pool.Exec(t.Context(), `INSERT INTO wallets (customer_id, balance_cents) VALUES ($1, $2)`, customer, 300*n)
				require.NoError(t, err)
				evs := make([]conformance.Event, n)
				for i := range evs {
					orderID := uuid.Must(uuid.NewV7())
					evs[i], err = event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
						Order:      event.Order{OrderID: orderID, CustomerID: customer},
						Lines:      event.Lines{{SKU: "apple", Quantity: 3, UnitPriceCents: 100}},
						TotalCents: 300,
					})
					require.NoError(t, err)
				}
				return evs
			}
			placed := func(t testing.TB, env conformance.Env) conformance.Event { return placedN(t, env, 1)[0] }
			// debited is an OrderPlaced, and its payload, that payment
			// has handled, committed: the order debited, its customer's
			// wallet empty.
			debited := func(t testing.TB, env conformance.Env) (conformance.Event, event.OrderPlacedV1) {
				ev := placed(t, env)
				tx, err := env.Pool.Begin(t.Context())
				require.NoError(t, err)
				require.NoError(t, s.HandleOrderPlaced(t.Context(), tx, ev))
				require.NoError(t, tx.Commit(t.Context()))
				var p event.OrderPlacedV1
				require.NoError(t, ev.Decode(&p))
				return ev, p
			}
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.PaymentOrders: {{
					NewEvent: placed, NewEvents: placedN,
					Effect: conformance.Count(`SELECT count(*)::int FROM payments WHERE order_id = $1::uuid`, orderOf),
				}},
				streams.PaymentInventory: {{
					// The StockRejected of an order debited before.
					NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
						ev, p := debited(t, env)
						rejected, err := ev.Caused("inventory", event.StockRejected, event.StockRejectedV1{Order: p.Order, AmountCents: p.TotalCents, Reason: "out of apple"})
						require.NoError(t, err)
						return rejected
					},
					Effect: conformance.Count(`SELECT count(*)::int FROM payments WHERE order_id = $1::uuid AND status = 'REFUNDED'`, orderOf),
				}},
				streams.PaymentExpiries: {{
					// The OrderExpired of an order debited before, PAID at its
					// deadline.
					NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
						_, p := debited(t, env)
						ev, err := event.New("order", event.OrderExpired, p.OrderID.String(), event.OrderExpiredV1{
							Order: p.Order, Deadline: time.Now().UTC(), Status: "PAID", TotalCents: p.TotalCents,
						})
						require.NoError(t, err)
						return ev
					},
					// The refunds of the order: none until its payment is
					// REFUNDED, then as many as its amount is back in the
					// wallet, which the debit emptied; a refund paid twice
					// counts 2.
					Effect: conformance.Count(`
						SELECT CASE p.status WHEN 'REFUNDED' THEN w.balance_cents / p.amount_cents ELSE 0 END::int
						FROM payments p JOIN wallets w USING (customer_id)
						WHERE p.order_id = $1::uuid`, orderOf),
				}},
			})
		},
	})
}

// orderOf is the order an event is about: its subject.
func orderOf(ev conformance.Event) any { return ev.Subject }

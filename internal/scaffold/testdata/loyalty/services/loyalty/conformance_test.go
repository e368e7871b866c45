package loyalty

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestConformance runs the conformance kit against the service's handlers
// as run.go wires them, its Subscriptions (docs/new-service.md, "Prove
// your handlers"):
// duplicates, a crash between commit and ack, writes only on the inbox's
// transaction, emits only through the outbox, retries, dead letters,
// replays and owners, in each mode the inbox runs. When the handlers'
// effect changes, change Effect to count it. (An internal test, so that a
// subscription's handler may be an unexported dispatcher.)
func TestConformance(t *testing.T) {
	t.Parallel()
	migrations, err := db.Migrations(Name)
	require.NoError(t, err)
	conformance.Run(t, conformance.Service{
		Name:       Name,
		Migrations: migrations,
		New: func(env conformance.Env) []conformance.Subscription {
			s := New(env.Pool)
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.LoyaltyOrders: {
					{
						// A OrderConfirmed of a new order of a customer of its own.
						NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
							orderID, customer := uuid.Must(uuid.NewV7()), "c-"+uuid.NewString()
							ev, err := event.New("order", event.OrderConfirmed, orderID.String(), event.OrderConfirmedV1{Order: event.Order{OrderID: orderID, CustomerID: customer}, TotalCents: 300})
							require.NoError(t, err)
							return ev
						},
						Effect: customerEffect,
					},
				},
			})
		},
	})
}

// customerEffect counts the starter effect of an event: the tally of its
// customer.
var customerEffect = conformance.Count(`SELECT coalesce(sum(events), 0)::int FROM customer_events WHERE customer_id = $1`,
	func(ev conformance.Event) any {
		var o struct {
			CustomerID string `json:"customer_id"`
		}
		_ = json.Unmarshal(ev.Data, &o) // a poison payload has no customer, and no effect
		return o.CustomerID
	})

package notify_test

import (
	"sync/atomic"
	"testing"

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
// so does an OrderExpired; an order's milestones, together or at once,
// write one each.
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
			// notify-orders#01. Events that share their entities are
			// milestones of one order, each of another kind, starting from
			// the entry's own.
			byEvent := conformance.Count(`SELECT count(*)::int FROM notifications WHERE event_id = $1`,
				func(ev conformance.Event) any { return ev.ID })
			return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
				streams.NotifyOrders: {{
					// The milestones in turn, one per call, across all the
					// kit's runs.
					NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
						return newMilestone(t, int(made.Add(1))%expired)
					},
					NewEvents: func(t testing.TB, _ conformance.Env, n int) []conformance.Event { return milestones(t, 0, n) },
					Effect:    byEvent,
				}, {
					NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
						return newMilestone(t, expired)
					},
					NewEvents: func(t testing.TB, _ conformance.Env, n int) []conformance.Event { return milestones(t, expired, n) },
					Effect:    byEvent,
				}},
			})
		},
	})
}

// kinds are the order events notify writes an e-mail for.
var kinds = []event.Type{event.OrderPlaced, event.OrderConfirmed, event.OrderRejected, event.OrderCancelled, event.OrderExpired}

// expired is OrderExpired's index in kinds.
const expired = 4

// newMilestone is the event of a new order's milestone kinds[i].
func newMilestone(t testing.TB, i int) conformance.Event {
	return milestone(t, orderPlaced(t, "alice", "alice@example.com"), kinds[i])
}

// milestones is n events that share their orders: the milestones of one
// order from kinds[first] on, each of another kind (an order has one
// e-mail per kind: of two of a kind, the first to commit would win), a new
// order after every len(kinds).
func milestones(t testing.TB, first, n int) []conformance.Event {
	evs := make([]conformance.Event, n)
	var placed event.Envelope
	for i := range evs {
		if i%len(kinds) == 0 {
			placed = orderPlaced(t, "alice", "alice@example.com")
		}
		evs[i] = milestone(t, placed, kinds[(first+i)%len(kinds)])
	}
	return evs
}

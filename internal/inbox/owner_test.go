package inbox_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// An event that claims another owner than its type's, or another type than
// its subject's, or arrives on a subject the durable does not filter, is
// dead-lettered with the reason, and its handler never runs.
func TestEventsAreCheckedAgainstTheirOwner(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		// The server's durable takes all of orders.>, the topology's only
		// orders.placed.v1: a durable provisioned wider than declared.
		e := setup(t, streams.Consumer{FilterSubjects: []string{"orders.>"}})
		topology := streams.Topology{
			Streams:   []streams.Stream{{Name: testStream, Subjects: []string{"orders.>"}, Owner: "order"}},
			Consumers: []streams.Consumer{{Stream: testStream, Durable: testDurable, Service: "payment", FilterSubjects: []string{"orders.placed.v1"}}},
		}
		c := e.start(t, inbox.Config{Batched: batched, Topology: &topology}, writeEffect)

		good := ownedEvent(t, "order", event.OrderPlaced)
		forged := ownedEvent(t, "payment", event.OrderPlaced) // another owner
		mistyped := ownedEvent(t, "order", event.OrderConfirmed)
		unfiltered := ownedEvent(t, "order", event.OrderConfirmed)
		msg := msgOf(t, mistyped, "")
		msg.Subject = "orders.placed.v1" // a confirmation's type on a placement's subject
		for _, m := range []*nats.Msg{msgOf(t, good, ""), msgOf(t, forged, ""), msg, msgOf(t, unfiltered, "")} {
			e.publishMsg(t, m)
		}
		e.requireSettled(t)

		require.Equal(t, int64(1), e.effects(t, good.ID))
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 3)
		wants := map[uuid.UUID]string{
			forged.ID:     `ce-source "payment" is not "order", the owner of onceflow.order.placed.v1`,
			mistyped.ID:   "type onceflow.order.confirmed.v1 arrived on orders.placed.v1",
			unfiltered.ID: "subject orders.confirmed.v1 is not one durable inbox-test filters",
		}
		for i, d := range dlq {
			id := uuid.MustParse(d.Header.Get(event.HeaderID))
			require.Contains(t, requireDeadLetter(t, d, uint64(i+2), 1), wants[id])
			require.Zero(t, e.effects(t, id))
		}
		require.Equal(t, int64(3), c.Stats().DeadLettered)
		require.Equal(t, int64(1), e.claims(t))
	})
}

// ownedEvent returns a valid event of type typ whose ce-source is source.
func ownedEvent(t *testing.T, source string, typ event.Type) event.Envelope {
	t.Helper()
	ev := newEvent(t)
	ev.Source, ev.Type = source, typ
	return ev
}

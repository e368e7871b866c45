package outbox_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The smallest producer: the event is written on the caller's transaction,
// beside the state change it announces, so that both commit or neither
// does; the relay publishes it once committed, then marks it sent.
func Example() {
	ctx := context.Background()
	t, done := testenv.ForExample("Example")
	defer done()
	pool := testenv.NewServiceDatabase(t, "").Pool // a service's database, migrated
	js := testenv.NewNATS(t).JetStream(t)
	if err := streams.Provision(ctx, js, streams.Saga(streams.Config{})); err != nil {
		panic(err)
	}

	// In the producer's transaction: the business write, then Enqueue.
	ev, err := event.New("order", event.OrderPlaced, "order-1", map[string]string{"order_id": "order-1"})
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	// ... the state change the event announces goes here, on tx ...
	if err := outbox.Enqueue(ctx, tx, ev); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// The relay: a service runs it with Run until it stops; Flush publishes
	// what is unsent now.
	relay := outbox.NewRelay(pool, js, outbox.RelayConfig{}, slog.New(slog.DiscardHandler))
	sent, err := relay.Flush(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("marked sent:", sent)

	// The event is on its stream, its message id the event id.
	stream, err := js.Stream(ctx, streams.Orders)
	if err != nil {
		panic(err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "orders.placed.v1")
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Subject, msg.Header.Get(jetstream.MsgIDHeader) == ev.ID.String())
	// Output:
	// marked sent: 1
	// orders.placed.v1 true
}

package outbox_test

import (
	"context"
	"fmt"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The relay's reference loop: one row, publish, mark, until none is left.
// A Relay does the same a batch at a time, the batches pipelined, and is
// what a service runs; read this first.
func Example_referenceRelay() {
	ctx := context.Background()
	t, done := testenv.ForExample("Example_referenceRelay")
	defer done()
	pool := testenv.NewServiceDatabase(t, "").Pool
	js := testenv.NewNATS(t).JetStream(t)
	if err := streams.Provision(ctx, js, streams.Saga(streams.Config{})); err != nil {
		panic(err)
	}
	for _, order := range []string{"order-1", "order-2"} {
		ev, err := event.New("order", event.OrderPlaced, order, map[string]string{"order_id": order})
		if err != nil {
			panic(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		if err := outbox.Enqueue(ctx, tx, ev); err != nil {
			panic(err)
		}
		if err := tx.Commit(ctx); err != nil {
			panic(err)
		}
	}

	published := 0
	for {
		ok, err := outbox.PublishOne(ctx, pool, js)
		if err != nil {
			panic(err)
		}
		if !ok {
			break
		}
		published++
	}
	fmt.Println("published:", published)

	stream, err := js.Stream(ctx, streams.Orders)
	if err != nil {
		panic(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("on the stream:", info.State.Msgs)
	// Output:
	// published: 2
	// on the stream: 2
}

package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The smallest consumer: a handler that writes its effect on the inbox's
// transaction, which also holds the event's claim. An event delivered
// twice (here, published twice past the broker's dedup) has its effect
// once: the second claim finds the first, and the message is acked without
// calling the handler.
func Example() {
	ctx := context.Background()
	t, done := testenv.ForExample("Example")
	defer done()
	pool := testenv.NewServiceDatabase(t, "").Pool // a service's database, migrated
	js := testenv.NewNATS(t).JetStream(t)
	if err := streams.Provision(ctx, js, streams.Saga(streams.Config{})); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (order_id text NOT NULL)`); err != nil {
		panic(err)
	}

	// The handler: the business write, on tx. The inbox has claimed the
	// event on tx before, and commits both together, then acks.
	handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO greetings (order_id) VALUES ($1)`, ev.Subject)
		return err
	}
	consumer := inbox.New(pool, js, inbox.Config{Stream: streams.Orders, Durable: streams.PaymentOrders},
		handler, slog.New(slog.DiscardHandler))
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- consumer.Run(runCtx) }()

	orderID := uuid.New()
	ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 25}},
		TotalCents: 25,
	})
	if err != nil {
		panic(err)
	}
	for _, msgID := range []string{"first", "second"} { // two messages, one event
		msg, err := ev.Msg()
		if err != nil {
			panic(err)
		}
		msg.Header.Set("Nats-Msg-Id", msgID)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			panic(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if s := consumer.Stats(); s.Processed+s.Duplicates == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-stopped; err != nil {
		panic(err)
	}

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM greetings`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Printf("%+v, %d greeting\n", consumer.Stats(), n)
	// Output:
	// {Processed:1 Duplicates:1 DeadLettered:0 Retried:0}, 1 greeting
}

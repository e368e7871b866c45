package conformance_test

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

//go:embed testdata/migrations
var migrations embed.FS

// testService is the kit's test subject: a payment-like service that, for
// each OrderPlaced, records the order in its effects table and emits
// PaymentRejected through the outbox. broken, when set, replaces its
// handler with one that breaks a guarantee.
type testService struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	seen *sync.Map // of event ids; only the in-memory-state breakage uses it
}

// handle is the correct handler.
func (s *testService) handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.OrderPlacedV1
	if err := ev.Decode(&p); err != nil {
		return err // wraps event.ErrInvalid: dead-lettered at once
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID); err != nil {
		return fmt.Errorf("record order %s: %w", p.OrderID, err)
	}
	next, err := s.rejection(ev, p)
	if err != nil {
		return err
	}
	return outbox.Enqueue(ctx, tx, next)
}

func (s *testService) rejection(ev event.Envelope, p event.OrderPlacedV1) (event.Envelope, error) {
	return ev.Caused("payment", event.PaymentRejected, event.PaymentRejectedV1{
		Order: p.Order, AmountCents: p.TotalCents, Reason: "conformance",
	})
}

// handleBatch is the set-based form: the same effect for each event.
func (s *testService) handleBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
	for _, ev := range evs {
		if err := s.handle(ctx, tx, ev); err != nil {
			return err
		}
	}
	return nil
}

// service is the kit's description of the test service, with handler
// (made from the service's) as its handler.
func service(t *testing.T, handler func(*testService) conformance.Handler) conformance.Service {
	t.Helper()
	sub, err := fs.Sub(migrations, "testdata/migrations")
	if err != nil {
		t.Fatal(err)
	}
	return conformance.Service{
		Name:       "conformancetest",
		Migrations: sub,
		New: func(env conformance.Env) []conformance.Subscription {
			s := &testService{pool: env.Pool, js: env.JS, seen: &sync.Map{}}
			return []conformance.Subscription{{
				Stream:       streams.Orders,
				Durable:      streams.PaymentOrders,
				Handler:      handler(s),
				BatchHandler: s.handleBatch,
				NewEvent:     orderPlaced,
				Effect: conformance.Count(`SELECT count(*) FROM effects WHERE order_id = $1`,
					func(ev conformance.Event) any { return ev.Subject }),
			}}
		},
	}
}

// orderPlaced is an OrderPlaced of a new order, from its owner.
func orderPlaced(t testing.TB, _ conformance.Env) conformance.Event {
	orderID := uuid.Must(uuid.NewV7())
	ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 2, UnitPriceCents: 25}},
		TotalCents: 50,
	})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestConformance runs the kit against a correct handler: every property
// passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, service(t, func(s *testService) conformance.Handler { return s.handle }))
}

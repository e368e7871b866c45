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
	"github.com/onceflow/onceflow/internal/streams"
)

//go:embed testdata/migrations
var migrations embed.FS

// testService is the kit's test subject: a payment-like service that, for
// each OrderPlaced, debits its customer's wallet, records the order in its
// effects table and emits PaymentRejected through the outbox. A breakage
// replaces its handler, or its set-based handler, with one that breaks a
// guarantee.
type testService struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	seen    *sync.Map // of event ids; only the in-memory-state breakage uses it
	emitted *sync.Map // of event ids; only the emitted-in-memory breakage uses it
}

// lockWallet reads a wallet's balance and locks it until the commit.
const lockWallet = `SELECT balance_cents FROM wallets WHERE customer_id = $1 FOR UPDATE`

// handle is the correct handler.
func (s *testService) handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.OrderPlacedV1
	if err := ev.Decode(&p); err != nil {
		return err // wraps event.ErrInvalid: dead-lettered at once
	}
	if err := s.record(ctx, tx, ev, p, lockWallet); err != nil {
		return err
	}
	return s.emit(ctx, tx, ev, p)
}

// emit writes the order's PaymentRejected to the outbox.
func (s *testService) emit(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
	next, err := s.rejection(ev, p)
	if err != nil {
		return err
	}
	return outbox.Enqueue(ctx, tx, next)
}

// record debits the order's wallet, its balance read with read, and
// records the order.
func (s *testService) record(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1, read string) error {
	var balance int64
	if err := tx.QueryRow(ctx, read, p.CustomerID).Scan(&balance); err != nil {
		return fmt.Errorf("read wallet %s: %w", p.CustomerID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE wallets SET balance_cents = $2 WHERE customer_id = $1`, p.CustomerID, balance-p.TotalCents); err != nil {
		return fmt.Errorf("debit wallet %s: %w", p.CustomerID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID); err != nil {
		return fmt.Errorf("record order %s: %w", p.OrderID, err)
	}
	return nil
}

func (s *testService) rejection(ev event.Envelope, p event.OrderPlacedV1) (event.Envelope, error) {
	return ev.Caused("payment", event.PaymentRejected, event.PaymentRejectedV1{
		Order: p.Order, AmountCents: p.TotalCents, Reason: "conformance",
	})
}

// batchForm is how a set-based handler is written: correct when zero.
type batchForm struct {
	noOutbox    bool // never queues its outbox rows
	rowPerEvent bool // updates the wallets from one row per event, not per wallet
	tally       bool // bumps a tally through a connection of its own
}

// setBased is the set-based form: one UPDATE of the wallets, each debited
// the sum of its orders, and one INSERT of the orders.
func (s *testService) setBased(form batchForm) conformance.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *conformance.Pipeline) error {
		customers, totals, orders, ids := make([]string, len(evs)), make([]int64, len(evs)), make([]uuid.UUID, len(evs)), make([]uuid.UUID, len(evs))
		var next []event.Envelope
		for i, ev := range evs {
			var p event.OrderPlacedV1
			if err := ev.Decode(&p); err != nil {
				return err
			}
			customers[i], totals[i], orders[i], ids[i] = p.CustomerID, p.TotalCents, p.OrderID, ev.ID
			n, err := s.rejection(ev, p)
			if err != nil {
				return err
			}
			next = append(next, n)
		}
		// The wallets locked in key order: two batches cannot deadlock.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM wallets WHERE customer_id = ANY($1) ORDER BY customer_id FOR UPDATE`, customers); err != nil {
			return fmt.Errorf("lock wallets: %w", err)
		}
		debits := `SELECT customer_id, sum(total) AS total FROM unnest($1::text[], $2::bigint[]) AS u(customer_id, total) GROUP BY customer_id`
		if form.rowPerEvent {
			debits = `SELECT * FROM unnest($1::text[], $2::bigint[]) AS u(customer_id, total)`
		}
		_, _ = writes.Exec(ctx, `UPDATE wallets w SET balance_cents = w.balance_cents - d.total FROM (`+debits+`) d
			WHERE w.customer_id = d.customer_id AND w.customer_id = ANY($1)`, customers, totals)
		_, _ = writes.Exec(ctx, `INSERT INTO effects (order_id, event_id) SELECT * FROM unnest($1::uuid[], $2::uuid[])`, orders, ids)
		if form.tally {
			if err := s.bumpTally(ctx, len(evs)); err != nil {
				return err
			}
		}
		if form.noOutbox {
			return nil
		}
		return outbox.QueueBatch(ctx, writes, next)
	}
}

// bumpTally counts orders on a connection of the handler's own: a write
// outside the inbox's transaction.
func (s *testService) bumpTally(ctx context.Context, n int) error {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, `INSERT INTO tally (name, n) VALUES ('orders', $1) ON CONFLICT (name) DO UPDATE SET n = tally.n + excluded.n`, n)
	return err
}

// service is the kit's description of the test service, with handler
// (made from the service's) as its handler, and batch as its set-based
// handler (the correct one when nil).
func service(t *testing.T, handler func(*testService) conformance.Handler, batch func(*testService) conformance.BatchHandler) conformance.Service {
	t.Helper()
	sub, err := fs.Sub(migrations, "testdata/migrations")
	if err != nil {
		t.Fatal(err)
	}
	if batch == nil {
		batch = func(s *testService) conformance.BatchHandler { return s.setBased(batchForm{}) }
	}
	return conformance.Service{
		Name:       "conformancetest",
		Migrations: sub,
		New: func(env conformance.Env) []conformance.Subscription {
			s := &testService{pool: env.Pool, js: env.JS, seen: &sync.Map{}, emitted: &sync.Map{}}
			return []conformance.Subscription{{
				Stream:       streams.Orders,
				Durable:      streams.PaymentOrders,
				Handler:      handler(s),
				BatchHandler: batch(s),
				NewEvent: func(t testing.TB, env conformance.Env) conformance.Event {
					return ordersPlaced(t, env, 1)[0]
				},
				NewEvents: ordersPlaced,
				Effect: conformance.Count(`SELECT count(*) FROM effects WHERE order_id = $1`,
					func(ev conformance.Event) any { return ev.Subject }),
			}}
		},
	}
}

// ordersPlaced is n OrderPlaced of new orders of one new customer, whose
// wallet holds what they cost.
func ordersPlaced(t testing.TB, env conformance.Env, n int) []conformance.Event {
	customer := "c-" + uuid.NewString()
	if _, err := env.Pool.Exec(t.Context(), `INSERT INTO wallets (customer_id, balance_cents) VALUES ($1, $2)`, customer, 50*n); err != nil {
		t.Fatal(err)
	}
	evs := make([]conformance.Event, n)
	for i := range evs {
		orderID := uuid.Must(uuid.NewV7())
		ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
			Order:      event.Order{OrderID: orderID, CustomerID: customer},
			Lines:      event.Lines{{SKU: "apple", Quantity: 2, UnitPriceCents: 25}},
			TotalCents: 50,
		})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}

// TestConformance runs the kit against a correct handler: every property
// passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, service(t, func(s *testService) conformance.Handler { return s.handle }, nil))
}

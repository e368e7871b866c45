package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
	"github.com/onceflow/onceflow/services/order"
	"github.com/onceflow/onceflow/services/payment"
)

// skus is how many SKUs the inventory benchmark's orders spread over.
const skus = 1000

// debitedEvents returns n PaymentDebited events of one to three lines of
// random SKUs.
func debitedEvents(b testing.TB, n int) []event.Envelope {
	b.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), 2))
	evs := make([]event.Envelope, n)
	for i := range evs {
		var lines event.Lines
		for range 1 + rng.IntN(3) {
			lines = append(lines, event.OrderLine{SKU: fmt.Sprintf("sku%04d", rng.IntN(skus)), Quantity: 1 + rng.Int32N(3), UnitPriceCents: 100})
		}
		total, err := lines.Total()
		require.NoError(b, err)
		orderID := uuid.Must(uuid.NewV7())
		evs[i], err = event.New("payment", event.PaymentDebited, orderID.String(), event.PaymentDebitedV1{
			Order: event.Order{OrderID: orderID, CustomerID: "c1"}, Lines: lines, AmountCents: total,
		})
		require.NoError(b, err)
	}
	return evs
}

// serviceModes are the ways the services' batched consumers run a batch:
// per event, set-based, and set-based with two workers (two
// transactions in flight, CONSUMER_WORKERS=2), which overlap one batch's
// Go work with the other's database round trips.
var serviceModes = []struct {
	name     string
	setBased bool
	workers  int
}{{"batched", false, 1}, {"setbased", true, 1}, {"setbased/workers=2", true, 2}}

// BenchmarkPayment is payment's OrderPlaced handler through the batched
// inbox consumer: lock the payment, debit the wallet, record the payment,
// enqueue the outcome event; per event under savepoints, and set-based.
func BenchmarkPayment(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range serviceModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.walletsDB(b)
				js := newJetStream(b)
				provisionOrders(b, js, streams.Orders, "orders.>")
				s := payment.New(pool)
				cfg := inbox.Config{Stream: streams.Orders, Durable: benchConsumer, BatchSize: batchSize, Batched: true, Workers: m.workers}
				if m.setBased {
					cfg.BatchHandler = s.HandleOrderPlacedBatch
				}
				c := inbox.New(pool, js, cfg, s.HandleOrderPlaced, quiet)
				measureConsumer(b, js, envelopes(orderEvents(b, b.N)), c, func() int64 { return c.Stats().Processed })
				requireOutcomes(b, pool, b.N)
			})
		}
	}
}

// BenchmarkInventory is inventory's PaymentDebited handler through the
// batched inbox consumer: lock the order's stock rows, decide, decrement,
// record the reservation, enqueue the outcome; per event under savepoints,
// and set-based.
func BenchmarkInventory(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range serviceModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.newDB(b, schemaOf(b, inventory.Name))
				_, err := pool.Exec(context.Background(),
					`INSERT INTO stock (sku, available) SELECT format('sku%s', lpad(i::text, 4, '0')), 1000000000 FROM generate_series(0, $1 - 1) AS i`, skus)
				require.NoError(b, err)
				js := newJetStream(b)
				provisionOrders(b, js, streams.Payments, "payments.>")
				s := inventory.New(pool)
				cfg := inbox.Config{Stream: streams.Payments, Durable: benchConsumer, BatchSize: batchSize, Batched: true, Workers: m.workers}
				if m.setBased {
					cfg.BatchHandler = s.HandlePaymentDebitedBatch
				}
				c := inbox.New(pool, js, cfg, s.HandlePaymentDebited, quiet)
				measureConsumer(b, js, debitedEvents(b, b.N), c, func() int64 { return c.Stats().Processed })
				requireOutcomes(b, pool, b.N)
			})
		}
	}
}

// BenchmarkOrder is order's StockReserved handler through the batched inbox
// consumer, for PAID orders created beforehand: lock the order, record the
// event, confirm the order, enqueue OrderConfirmed and record it; per event
// under savepoints, and set-based.
func BenchmarkOrder(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range serviceModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.newDB(b, schemaOf(b, order.Name))
				evs := reservedEvents(b, pool, b.N)
				js := newJetStream(b)
				provisionOrders(b, js, streams.Inventory, "inventory.>")
				s := order.New(pool)
				cfg := inbox.Config{Stream: streams.Inventory, Durable: benchConsumer, BatchSize: batchSize, Batched: true, Workers: m.workers}
				if m.setBased {
					cfg.BatchHandler = s.HandleBatch
				}
				c := inbox.New(pool, js, cfg, s.HandleStockReserved, quiet)
				measureConsumer(b, js, evs, c, func() int64 { return c.Stats().Processed })
				requireOutcomes(b, pool, b.N)
			})
		}
	}
}

// reservedEvents creates n PAID orders in pool and returns a StockReserved
// event for each.
func reservedEvents(b testing.TB, pool *pgxpool.Pool, n int) []event.Envelope {
	b.Helper()
	ids := make([]uuid.UUID, n)
	evs := make([]event.Envelope, n)
	for i := range evs {
		ids[i] = uuid.Must(uuid.NewV7())
		var err error
		evs[i], err = event.New("inventory", event.StockReserved, ids[i].String(), event.StockReservedV1{
			Order: event.Order{OrderID: ids[i], CustomerID: "c1", CustomerEmail: "c1@example.com"},
			Lines: event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 100}},
		})
		require.NoError(b, err)
	}
	_, err := pool.Exec(context.Background(),
		`INSERT INTO orders (id, customer_id, customer_email, status, total_cents)
		 SELECT id, 'c1', 'c1@example.com', 'PAID', 100 FROM unnest($1::uuid[]) AS id`, ids)
	require.NoError(b, err)
	return evs
}

// requireOutcomes checks that the handler emitted one event per order.
func requireOutcomes(b testing.TB, pool *pgxpool.Pool, n int) {
	b.Helper()
	var rows int
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&rows))
	require.Equal(b, n, rows)
}

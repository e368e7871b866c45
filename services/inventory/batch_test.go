package inventory_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/inventory"
)

// TestPaymentDebitedBatchEqualsEventByEvent runs one random sequence of
// PaymentDebited events through HandlePaymentDebited, one transaction per
// event, and through HandlePaymentDebitedBatch in random batches, on two
// databases stocked alike, and requires the same stock, reservations and
// emitted events.
func TestPaymentDebitedBatchEqualsEventByEvent(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			ref, set := testenv.NewServiceDatabase(t, inventory.Name), testenv.NewServiceDatabase(t, inventory.Name)

			for _, sku := range stockedSKUs {
				n := rng.Int64N(60)
				for _, db := range []*testenv.Database{ref, set} {
					_, err := db.Pool.Exec(t.Context(), `INSERT INTO stock (sku, available) VALUES ($1, $2)`, sku, n)
					require.NoError(t, err)
				}
			}
			evs := randomDebits(t, rng, 300)

			batches := apptest.RandomBatches(rng, evs)
			fellBack := apptest.ApplyBothForms(t, ref.Pool, set.Pool, batches,
				inventory.New(ref.Pool).HandlePaymentDebited, inventory.New(set.Pool).HandlePaymentDebitedBatch)
			// A batch falls back to the per-event handler exactly when it
			// re-emits an order of an earlier batch.
			require.Equal(t, apptest.Repeating(batches), fellBack)
			require.Positive(t, fellBack, "some batches re-emit an earlier order")
			require.Less(t, fellBack, len(batches)/2, "most batches are set-based")
			apptest.RequireSameRows(t, ref.Pool, set.Pool,
				`SELECT sku, available FROM stock ORDER BY sku`,
				`SELECT order_id, status, reason FROM reservations ORDER BY order_id`,
				`SELECT order_id, sku, quantity FROM reservation_lines ORDER BY order_id, sku`,
				// Emitted events get fresh ids and times; everything else,
				// their order included, must match.
				`SELECT event_type, source, subject, nats_subject, data, traceparent FROM outbox ORDER BY id`,
			)
			var reserved, rejected int
			require.NoError(t, ref.Pool.QueryRow(t.Context(),
				`SELECT count(*) FILTER (WHERE status = 'RESERVED'), count(*) FILTER (WHERE status = 'REJECTED') FROM reservations`).
				Scan(&reserved, &rejected))
			require.Positive(t, reserved, "the sequence reserves")
			require.Positive(t, rejected, "the sequence runs out of stock")
		})
	}
}

// stockedSKUs are the SKUs the random sequences find in stock; "ghost" is
// never stocked.
var stockedSKUs = []string{"a", "b", "c", "d", "e"}

// randomDebits returns n PaymentDebited events of one to four lines, which
// may repeat a SKU and rarely name an unknown one; about one in forty
// re-emits an earlier order under a new event id.
func randomDebits(t *testing.T, rng *rand.Rand, n int) []event.Envelope {
	t.Helper()
	var evs []event.Envelope
	for len(evs) < n {
		if len(evs) > 0 && rng.IntN(40) == 0 {
			evs = append(evs, reemitted(t, evs[rng.IntN(len(evs))]))
			continue
		}
		var lines []event.OrderLine
		for range 1 + rng.IntN(4) {
			sku := stockedSKUs[rng.IntN(len(stockedSKUs))]
			if rng.IntN(40) == 0 {
				sku = "ghost"
			}
			lines = append(lines, line(sku, 1+rng.Int32N(5)))
		}
		ev := paymentDebited(t, lines...)
		if rng.IntN(2) == 0 {
			ev.TraceParent = fmt.Sprintf("00-%032x-%016x-01", rng.Uint64(), rng.Uint64()|1)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestOrdersCompetingForStockAreDecidedInStreamOrder sends more orders for
// one SKU than its stock covers, with a poison event among them, at once, so
// that they share batches: the orders that fit are reserved in stream
// order, the rest rejected, and the poison dead-lettered without failing
// its batch.
func TestOrdersCompetingForStockAreDecidedInStreamOrder(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		setStock(t, svc, "apple", 10)
		setStock(t, svc, "pear", 100)
		outcomes := svc.Watch(t, streams.Inventory, "inventory.>")
		dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+streams.InventoryPayments)

		var orders []event.Envelope
		for range 8 {
			orders = append(orders, paymentDebited(t, line("pear", 1), line("apple", 3)))
		}
		poison := paymentDebited(t, line("apple", 1))
		poison.Data = []byte(strings.Replace(string(poison.Data), `"amount_cents":125`, `"amount_cents":1`, 1))
		msgs := []*nats.Msg{}
		for _, ev := range slices.Insert(slices.Clone(orders), 4, poison) {
			msg, err := ev.Msg()
			require.NoError(t, err)
			msgs = append(msgs, msg)
		}
		msgs = append(msgs, asDuplicate(t, orders[0]))
		for _, msg := range msgs {
			_, err := svc.JS.PublishMsgAsync(msg)
			require.NoError(t, err)
		}
		select {
		case <-svc.JS.PublishAsyncComplete():
		case <-t.Context().Done():
		}

		require.Equal(t, poison.ID, dlq.Wait(t, 1)[0].ID)
		got := map[string]event.Type{}
		for _, ev := range outcomes.Wait(t, len(orders)) {
			got[ev.Subject] = ev.Type
		}
		for i, ev := range orders {
			want := event.StockRejected
			if i < 3 {
				want = event.StockReserved
			}
			require.Equal(t, want, got[ev.Subject], "order %d", i)
		}
		requireConsumed(t, svc)
		require.Len(t, outcomes.Seen(), len(orders))
		require.Equal(t, int64(1), available(t, svc, "apple"))
		require.Equal(t, int64(97), available(t, svc, "pear"))
	})
}

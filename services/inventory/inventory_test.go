package inventory_test

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/inventory"
)

const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func start(t *testing.T, configure ...func(*app.Config)) *apptest.Service {
	t.Helper()
	return apptest.Start(t, inventory.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
		return inventory.Run(ctx, inventory.Config{Config: cfg}, l)
	}, configure...)
}

// concurrent makes every delivery its own transaction on one of many fetch
// loops, so that handlers really race each other.
func concurrent(cfg *app.Config) {
	cfg.ConsumerBatched = new(false)
	cfg.ConsumerBatchSize = 1
	cfg.ConsumerWorkers = 10
}

// batchedConcurrent runs several batched workers at once.
func batchedConcurrent(cfg *app.Config) {
	cfg.ConsumerBatched = new(true)
	cfg.ConsumerBatchSize = 4
	cfg.ConsumerWorkers = 4
}

// batchedPerEvent is batchedConcurrent without the batch handler.
func batchedPerEvent(cfg *app.Config) {
	batchedConcurrent(cfg)
	apptest.PerEvent(cfg)
}

// setStock stocks a new SKU at available through the ledger: a receipt,
// and for a level of 0 an adjustment that takes it back.
func setStock(t *testing.T, svc *apptest.Service, sku string, available int64) {
	t.Helper()
	received := max(available, 1)
	resp := svc.Do(t, http.MethodPost, "/stock/"+sku+"/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": received}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	if received > available {
		resp = svc.Do(t, http.MethodPost, "/stock/"+sku+"/adjustments", svc.AsAdmin(t, idempotencyKey()), map[string]any{"delta": available - received, "reason": "sold out"}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

// idempotencyKey is a header with a new Idempotency-Key.
func idempotencyKey() http.Header {
	return http.Header{"Idempotency-Key": {uuid.NewString()}}
}

// available returns the level of sku, or -1 if it is unknown.
func available(t *testing.T, svc *apptest.Service, sku string) int64 {
	t.Helper()
	var item inventory.StockItem
	resp := svc.Do(t, http.MethodGet, "/stock/"+sku, svc.AsAdmin(t), nil, &item)
	if resp.StatusCode == http.StatusNotFound {
		return -1
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return item.Available
}

func line(sku string, quantity int32) event.OrderLine {
	return event.OrderLine{SKU: sku, Quantity: quantity, UnitPriceCents: 125}
}

// paymentDebited is a PaymentDebited for a new order of lines, as payment
// would emit it.
func paymentDebited(t *testing.T, lines ...event.OrderLine) event.Envelope {
	t.Helper()
	orderID := uuid.Must(uuid.NewV7())
	total, err := event.Lines(lines).Total()
	require.NoError(t, err)
	ev, err := event.New("payment", event.PaymentDebited, orderID.String(), event.PaymentDebitedV1{
		Order:       event.Order{OrderID: orderID, CustomerID: "alice", CustomerEmail: "alice@example.com"},
		Lines:       lines,
		AmountCents: total,
	})
	require.NoError(t, err)
	ev.TraceParent = traceParent
	return ev
}

// reemitted is the same PaymentDebited under a new event id, as a producer
// that wrote it twice would emit it.
func reemitted(t *testing.T, ev event.Envelope) event.Envelope {
	t.Helper()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ev.ID = id
	return ev
}

func decodeDebited(t *testing.T, ev event.Envelope) event.PaymentDebitedV1 {
	t.Helper()
	var p event.PaymentDebitedV1
	require.NoError(t, ev.Decode(&p))
	return p
}

// publishAtOnce publishes every message from its own goroutine.
func publishAtOnce(t *testing.T, svc *apptest.Service, msgs []*nats.Msg) {
	t.Helper()
	var g errgroup.Group
	for _, msg := range msgs {
		g.Go(func() error {
			_, err := svc.JS.PublishMsg(t.Context(), msg)
			return err
		})
	}
	require.NoError(t, g.Wait())
}

// asDuplicate is ev's message under a fresh Nats-Msg-Id, so that only the
// inbox can drop it.
func asDuplicate(t *testing.T, ev event.Envelope) *nats.Msg {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
	return msg
}

// requireConsumed waits until inventory has acknowledged everything published
// on the PAYMENTS stream so far.
func requireConsumed(t *testing.T, svc *apptest.Service) {
	t.Helper()
	stream, err := svc.JS.Stream(t.Context(), streams.Payments)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	last := info.State.LastSeq
	cons, err := svc.JS.Consumer(t.Context(), streams.Payments, streams.InventoryPayments)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ci, err := cons.Info(t.Context())
		require.NoError(t, err)
		return ci.AckFloor.Stream >= last && ci.NumAckPending == 0 && ci.NumPending == 0
	}, 30*time.Second, 20*time.Millisecond, "inventory did not consume up to stream sequence %d", last)
}

// emitted counts the outbox rows by event type: every event the service has
// ever emitted, published or not.
func emitted(t *testing.T, svc *apptest.Service) map[event.Type]int {
	t.Helper()
	rows, err := svc.DB.Pool.Query(t.Context(), `SELECT event_type, count(*) FROM outbox GROUP BY event_type`)
	require.NoError(t, err)
	defer rows.Close()
	counts := map[event.Type]int{}
	for rows.Next() {
		var typ string
		var n int
		require.NoError(t, rows.Scan(&typ, &n))
		counts[event.Type(typ)] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

type reservation struct {
	status, reason string
	lines          map[string]int64
}

func reservationOf(t *testing.T, svc *apptest.Service, orderID uuid.UUID) reservation {
	t.Helper()
	var r reservation
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
		`SELECT status, reason FROM reservations WHERE order_id = $1`, orderID).Scan(&r.status, &r.reason))
	rows, err := svc.DB.Pool.Query(t.Context(), `SELECT sku, quantity FROM reservation_lines WHERE order_id = $1`, orderID)
	require.NoError(t, err)
	defer rows.Close()
	r.lines = map[string]int64{}
	for rows.Next() {
		var sku string
		var q int64
		require.NoError(t, rows.Scan(&sku, &q))
		r.lines[sku] = q
	}
	require.NoError(t, rows.Err())
	return r
}

func TestPaymentDebitedReservesAllLinesOrNone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		stock     map[string]int64
		lines     []event.OrderLine
		wantType  event.Type
		wantStock map[string]int64 // -1: unknown SKU
		wantLines map[string]int64 // what the reservation took
		wantSKU   string           // named by the rejection
	}{
		{
			name:      "every line covered",
			stock:     map[string]int64{"apple": 10, "pear": 5},
			lines:     []event.OrderLine{line("apple", 3), line("pear", 2)},
			wantType:  event.StockReserved,
			wantStock: map[string]int64{"apple": 7, "pear": 3},
			wantLines: map[string]int64{"apple": 3, "pear": 2},
		},
		{
			name:      "exactly covered",
			stock:     map[string]int64{"apple": 3},
			lines:     []event.OrderLine{line("apple", 3)},
			wantType:  event.StockReserved,
			wantStock: map[string]int64{"apple": 0},
			wantLines: map[string]int64{"apple": 3},
		},
		{
			name:      "repeated sku lines summed",
			stock:     map[string]int64{"apple": 5, "pear": 1},
			lines:     []event.OrderLine{line("apple", 3), line("pear", 1), line("apple", 2)},
			wantType:  event.StockReserved,
			wantStock: map[string]int64{"apple": 0, "pear": 0},
			wantLines: map[string]int64{"apple": 5, "pear": 1},
		},
		{
			name:      "repeated sku lines each covered but not their sum",
			stock:     map[string]int64{"apple": 4, "pear": 9},
			lines:     []event.OrderLine{line("apple", 3), line("pear", 1), line("apple", 2)},
			wantType:  event.StockRejected,
			wantStock: map[string]int64{"apple": 4, "pear": 9},
			wantSKU:   "apple",
		},
		{
			name:      "unknown sku",
			stock:     map[string]int64{"apple": 10},
			lines:     []event.OrderLine{line("apple", 1), line("ghost", 1)},
			wantType:  event.StockRejected,
			wantStock: map[string]int64{"apple": 10, "ghost": -1},
			wantSKU:   "ghost",
		},
		{
			name:      "short line leaves every sku untouched",
			stock:     map[string]int64{"apple": 10, "pear": 1, "zucchini": 8},
			lines:     []event.OrderLine{line("zucchini", 8), line("apple", 3), line("pear", 2)},
			wantType:  event.StockRejected,
			wantStock: map[string]int64{"apple": 10, "pear": 1, "zucchini": 8},
			wantSKU:   "pear",
		},
		{
			name:      "sku at zero",
			stock:     map[string]int64{"apple": 0},
			lines:     []event.OrderLine{line("apple", 1)},
			wantType:  event.StockRejected,
			wantStock: map[string]int64{"apple": 0},
			wantSKU:   "apple",
		},
	}
	for _, tt := range tests {
		apptest.EachMode(t, tt.name, func(t *testing.T, mode func(*app.Config)) {
			svc := start(t, mode)
			for sku, n := range tt.stock {
				setStock(t, svc, sku, n)
			}
			outcomes := svc.Watch(t, streams.Inventory, "inventory.>")
			ev := paymentDebited(t, tt.lines...)
			debited := decodeDebited(t, ev)
			svc.Publish(t, ev)

			got := outcomes.Wait(t, 1)[0]
			require.Equal(t, tt.wantType, got.Type)
			require.Equal(t, inventory.Name, got.Source)
			require.Equal(t, ev.Subject, got.Subject)
			require.Equal(t, traceParent, got.TraceParent, "the outcome continues the debit's trace")
			res := reservationOf(t, svc, debited.OrderID)
			if tt.wantType == event.StockReserved {
				var p event.StockReservedV1
				require.NoError(t, got.Decode(&p))
				require.Equal(t, event.StockReservedV1{Order: debited.Order, Lines: debited.Lines}, p)
				require.Equal(t, inventory.StatusReserved, res.status)
				require.Empty(t, res.reason)
				require.Equal(t, tt.wantLines, res.lines)
			} else {
				var p event.StockRejectedV1
				require.NoError(t, got.Decode(&p))
				require.Equal(t, debited.Order, p.Order)
				require.Equal(t, debited.AmountCents, p.AmountCents, "the rejection carries what payment must refund")
				require.Contains(t, p.Reason, strconv.Quote(tt.wantSKU))
				require.Equal(t, inventory.StatusRejected, res.status)
				require.Equal(t, p.Reason, res.reason)
				require.Empty(t, res.lines)
			}
			for sku, want := range tt.wantStock {
				require.Equal(t, want, available(t, svc, sku), "stock of %s", sku)
			}
			requireConsumed(t, svc)
			require.Equal(t, map[event.Type]int{tt.wantType: 1}, emitted(t, svc))
		})
	}
}

func TestDuplicatePaymentDebitedTakesEffectOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lines     []event.OrderLine
		wantType  event.Type
		wantApple int64
	}{
		{"reserved", []event.OrderLine{line("apple", 4)}, event.StockReserved, 6},
		{"rejected", []event.OrderLine{line("apple", 11)}, event.StockRejected, 10},
	}
	for _, tt := range tests {
		apptest.EachMode(t, tt.name, func(t *testing.T, mode func(*app.Config)) {
			svc := start(t, mode)
			setStock(t, svc, "apple", 10)
			outcomes := svc.Watch(t, streams.Inventory, "inventory.>")
			ev := paymentDebited(t, tt.lines...)
			svc.Publish(t, ev)
			for range 5 {
				svc.PublishDuplicate(t, ev)
			}

			require.Equal(t, tt.wantType, outcomes.Wait(t, 1)[0].Type)
			requireConsumed(t, svc)
			require.Equal(t, 5, svc.InboxCount(t, streams.InventoryPayments, "duplicate"))
			require.Equal(t, tt.wantApple, available(t, svc, "apple"), "stock taken once")
			require.Equal(t, map[event.Type]int{tt.wantType: 1}, emitted(t, svc), "one outcome, whatever the deliveries")
		})
	}
}

func TestSecondPaymentDebitedForAnOrderChangesNothing(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "after a reservation", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		setStock(t, svc, "apple", 10)
		first := paymentDebited(t, line("apple", 4))
		svc.Publish(t, first)
		requireConsumed(t, svc)
		require.Equal(t, int64(6), available(t, svc, "apple"))

		svc.Publish(t, reemitted(t, first))
		requireConsumed(t, svc)
		require.Equal(t, 2, svc.InboxCount(t, streams.InventoryPayments, "processed"), "a new event id gets past the inbox")
		require.Equal(t, int64(6), available(t, svc, "apple"), "the order's reservation is not taken twice")
		require.Equal(t, map[event.Type]int{event.StockReserved: 1}, emitted(t, svc))
	})
	apptest.EachMode(t, "after a rejection", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		first := paymentDebited(t, line("apple", 4))
		svc.Publish(t, first)
		requireConsumed(t, svc)

		// Stock arriving later does not reopen the decision: payment may
		// already have refunded the order.
		setStock(t, svc, "apple", 10)
		svc.Publish(t, reemitted(t, first))
		requireConsumed(t, svc)
		require.Equal(t, int64(10), available(t, svc, "apple"))
		require.Equal(t, inventory.StatusRejected, reservationOf(t, svc, decodeDebited(t, first).OrderID).status)
		require.Equal(t, map[event.Type]int{event.StockRejected: 1}, emitted(t, svc))
	})
}

func TestConcurrentDuplicatesReserveOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		configure func(*app.Config)
		// distinct publishes 10 events for one order under different ids
		// instead of one event 10 times: the reservation's key decides.
		distinct bool
	}{
		{"same event", concurrent, false},
		{"same event, batched", batchedConcurrent, false},
		{"same event, batched per event", batchedPerEvent, false},
		{"distinct events for one order", concurrent, true},
		{"distinct events for one order, batched", batchedConcurrent, true},
		{"distinct events for one order, batched per event", batchedPerEvent, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := start(t, tt.configure)
			setStock(t, svc, "apple", 10)
			setStock(t, svc, "pear", 10)
			ev := paymentDebited(t, line("pear", 2), line("apple", 3))
			msgs := make([]*nats.Msg, 10)
			for i := range msgs {
				if tt.distinct {
					ev = reemitted(t, ev)
				}
				msgs[i] = asDuplicate(t, ev)
			}
			publishAtOnce(t, svc, msgs)

			requireConsumed(t, svc)
			require.Equal(t, int64(7), available(t, svc, "apple"))
			require.Equal(t, int64(8), available(t, svc, "pear"))
			require.Equal(t, map[event.Type]int{event.StockReserved: 1}, emitted(t, svc))
			require.Zero(t, svc.InboxCount(t, streams.InventoryPayments, "retried"), "a race for one order is decided without errors")
		})
	}
}

func TestConcurrentOrdersNeverOversell(t *testing.T) {
	t.Parallel()
	const stock, quantity, orders = 25, 3, 20
	for name, configure := range map[string]func(*app.Config){"unbatched": concurrent, "batched": batchedConcurrent, "batched per event": batchedPerEvent} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc := start(t, configure)
			setStock(t, svc, "apple", stock)
			msgs := make([]*nats.Msg, orders)
			for i := range msgs {
				msgs[i] = asDuplicate(t, paymentDebited(t, line("apple", quantity)))
			}
			publishAtOnce(t, svc, msgs)

			requireConsumed(t, svc)
			reserved := stock / quantity
			require.Equal(t, map[event.Type]int{event.StockReserved: reserved, event.StockRejected: orders - reserved}, emitted(t, svc))
			require.Equal(t, int64(stock-reserved*quantity), available(t, svc, "apple"))
			var taken int64
			require.NoError(t, svc.DB.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(quantity), 0) FROM reservation_lines`).Scan(&taken))
			require.Equal(t, int64(reserved*quantity), taken, "reserved + available = stocked")
		})
	}
}

// TestOverlappingOrdersDoNotDeadlock runs orders over overlapping SKUs on
// concurrent transactions, one order each and in set-based batches: both
// forms lock stock rows in SKU order before they update them, so none
// waits for another in a cycle and none is retried.
func TestOverlappingOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	for name, configure := range map[string]func(*app.Config){"unbatched": concurrent, "batched": batchedConcurrent} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			overlappingOrders(t, configure)
		})
	}
}

func overlappingOrders(t *testing.T, configure func(*app.Config)) {
	svc := start(t, configure)
	skus := []string{"a", "b", "c", "d"}
	for _, sku := range skus {
		setStock(t, svc, sku, 1000)
	}
	// Each order names two to four SKUs, starting at a different one, so
	// that unsorted locking would take overlapping locks in opposite orders.
	const orders = 60
	want := map[string]int64{}
	msgs := make([]*nats.Msg, orders)
	for i := range msgs {
		var lines []event.OrderLine
		for j := range 2 + i%3 {
			sku := skus[(i+j*3)%len(skus)]
			lines = append(lines, line(sku, 1))
			want[sku]++
		}
		msgs[i] = asDuplicate(t, paymentDebited(t, lines...))
	}
	publishAtOnce(t, svc, msgs)

	requireConsumed(t, svc)
	require.Equal(t, map[event.Type]int{event.StockReserved: orders}, emitted(t, svc))
	for _, sku := range skus {
		require.Equal(t, 1000-want[sku], available(t, svc, sku), "stock of %s", sku)
	}
	require.Zero(t, svc.InboxCount(t, streams.InventoryPayments, "retried"), "no deadlock, no retry")
}

func TestInvalidPaymentDebitedIsDeadLettered(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		setStock(t, svc, "apple", 10)
		// A PaymentDebited whose amount does not match its lines can never be
		// processed: it goes to the DLQ instead of being retried or reserved.
		ev := paymentDebited(t, line("apple", 1))
		ev.Data = []byte(strings.Replace(string(ev.Data), `"amount_cents":125`, `"amount_cents":1`, 1))
		dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+streams.InventoryPayments)
		svc.Publish(t, ev)

		require.Equal(t, ev.ID, dlq.Wait(t, 1)[0].ID)
		requireConsumed(t, svc)
		require.Equal(t, int64(10), available(t, svc, "apple"))
		require.Empty(t, emitted(t, svc))
	})
}

// TestHandlersWriteOnlyInTheirTransaction runs the handler, on each of its
// paths, in a transaction that is then rolled back: its stock,
// reservation and outbox writes roll back with it.
func TestHandlersWriteOnlyInTheirTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, inventory.Name)
	s := inventory.New(db.Pool)
	_, err := db.Pool.Exec(t.Context(), `INSERT INTO stock (sku, available) VALUES ('kiwi', 5)`)
	require.NoError(t, err)

	apptest.RequireRollsBack(t, db.Pool,
		apptest.Handled{Name: "PaymentDebited reserved", Handle: s.HandlePaymentDebited, Event: paymentDebited(t, line("kiwi", 2))},
		apptest.Handled{Name: "PaymentDebited rejected", Handle: s.HandlePaymentDebited, Event: paymentDebited(t, line("kiwi", 9))},
	)
}

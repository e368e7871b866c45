package order_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/order"
)

// effectQueries read what the order handlers write, but for what differs
// between two runs: the ids and times of the events they emit, and
// updated_at (whether it moved is compared).
var effectQueries = []string{
	`SELECT id, status, updated_at > created_at FROM orders ORDER BY id`,
	`SELECT order_id, event_id, event_type, at, reason, late FROM order_timeline
	 WHERE event_type NOT LIKE 'onceflow.order.%' ORDER BY order_id, event_id`,
	// The emitted events are in the timeline under their own ids and times.
	`SELECT t.order_id, t.event_type, t.reason, t.at = o.event_time FROM order_timeline t LEFT JOIN outbox o USING (event_id)
	 WHERE t.event_type LIKE 'onceflow.order.%' ORDER BY t.order_id, o.id`,
	`SELECT event_type, source, subject, nats_subject, data, traceparent FROM outbox ORDER BY id`,
}

// requireSameEffect requires the databases of ref and set to hold the same
// orders, timelines and emitted events.
func requireSameEffect(t *testing.T, ref, set *pgxpool.Pool) {
	t.Helper()
	apptest.RequireSameRows(t, ref, set, effectQueries...)
}

// seedOrders inserts n PENDING orders like place's into each of pools, with
// the same ids, and returns their sagas.
func seedOrders(t *testing.T, n int, pools ...*pgxpool.Pool) []saga {
	t.Helper()
	sagas := make([]saga, n)
	for i := range sagas {
		customer := fmt.Sprint("c", i%3)
		o := order.Order{
			ID:            uuid.Must(uuid.NewV7()),
			CustomerID:    customer,
			CustomerEmail: customer + "@example.com",
			Status:        order.StatusPending,
			TotalCents:    1500,
			Items:         []order.Item{{SKU: "apple", Quantity: 2, UnitPriceCents: 250}, {SKU: "pear", Quantity: 1, UnitPriceCents: 1000}},
		}
		for _, pool := range pools {
			_, err := pool.Exec(t.Context(), `INSERT INTO orders (id, customer_id, customer_email, status, total_cents) VALUES ($1, $2, $3, $4, $5)`,
				o.ID, o.CustomerID, o.CustomerEmail, o.Status, o.TotalCents)
			require.NoError(t, err)
		}
		sagas[i] = saga{t, o}
	}
	return sagas
}

// handlerOf is the per-event handler of an event type, whichever
// subscription carries it.
func handlerOf(s *order.Service, typ event.Type) inbox.Handler {
	return map[event.Type]inbox.Handler{
		event.PaymentDebited:  s.HandlePaymentDebited,
		event.PaymentRejected: s.HandlePaymentRejected,
		event.PaymentRefunded: s.HandlePaymentRefunded,
		event.StockReserved:   s.HandleStockReserved,
		event.StockRejected:   s.HandleStockRejected,
	}[typ]
}

// requireBatchEqualsEventByEvent applies batches with HandleBatch, one
// transaction each, on set, and their events one by one with their
// handlers, one transaction each, on ref, and requires the same effect.
func requireBatchEqualsEventByEvent(t *testing.T, ref, set *pgxpool.Pool, batches [][]event.Envelope) {
	t.Helper()
	refSvc := order.New(ref)
	perEvent := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		return handlerOf(refSvc, ev.Type)(ctx, tx, ev)
	}
	require.Zero(t, apptest.ApplyBothForms(t, ref, set, batches, perEvent, order.New(set).HandleBatch), "batches that fell back")
	requireSameEffect(t, ref, set)
}

// newDatabase returns a new order database.
func newDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testenv.NewServiceDatabase(t, order.Name).Pool
}

// reemitted is ev emitted again by its producer under a new event id.
func reemitted(ev event.Envelope) event.Envelope {
	ev.ID = uuid.Must(uuid.NewV7())
	return ev
}

// earlier is ev with its time moved back by d: delivered after events it
// happened before.
func earlier(ev event.Envelope, d time.Duration) event.Envelope {
	ev.Time = ev.Time.Add(-d)
	return ev
}

// TestBatchScenarios runs batches that hold the cases the set-based handler
// must get right through HandleBatch and through the per-event handlers,
// and requires the same effect.
func TestBatchScenarios(t *testing.T) {
	t.Parallel()
	ref, set := newDatabase(t), newDatabase(t)
	s := seedOrders(t, 12, ref, set)
	// o10 and o11 expired before the batches: every reply to them is late.
	for _, pool := range []*pgxpool.Pool{ref, set} {
		_, err := pool.Exec(t.Context(), `UPDATE orders SET status = 'EXPIRED' WHERE id = ANY ($1)`, []uuid.UUID{s[10].o.ID, s[11].o.ID})
		require.NoError(t, err)
	}

	// o3 has a stock refusal in its timeline before the batch, and one in
	// the batch that happened earlier still: the refund takes the earlier's
	// reason. o5's refund comes before a refusal that happened before it:
	// it cannot see it, unbatched, so it takes the generic reason.
	o3Early := earlier(s[3].stockRejected("no pears, early"), time.Minute)
	o5Early := earlier(s[5].stockRejected("no pears, unseen"), time.Minute)
	o8Debited := s[8].debited()
	batches := [][]event.Envelope{
		{s[3].stockRejected("no pears"), s[9].stockRejected("")},
		{
			s[1].debited(), s[1].reserved(), // one order twice: PAID, then CONFIRMED
			s[2].debited(), s[2].refunded(), // PAID, then CANCELLED for no known reason
			s[3].debited(), o3Early, s[3].refunded(),
			s[4].stockRejected("no apples"), s[4].refunded(),
			s[5].refunded(), o5Early,
			s[6].paymentRejected("insufficient funds"),
			s[7].paymentRejected(""),
			o8Debited, o8Debited, // the same event twice: one effect
			s[9].debited(), s[9].refunded(), // a refusal without a reason
			s[0].stockRejected("waits for its refund"),
			s[10].debited(), s[10].reserved(), s[11].paymentRejected("after expiry"),
		},
		{
			// Duplicates of the events that made orders terminal, under new
			// ids and under their own.
			reemitted(s[1].reserved()), reemitted(s[2].refunded()), reemitted(s[6].paymentRejected("again")),
			o3Early, o8Debited,
			// Events for terminal orders.
			s[1].refunded(), s[2].reserved(), s[3].stockRejected("late"), s[6].debited(), s[7].refunded(),
			s[8].reserved(), s[8].paymentRejected("too late"),
			s[11].debited(), s[11].stockRejected("after expiry"),
		},
	}
	requireBatchEqualsEventByEvent(t, ref, set, batches)

	want := map[uuid.UUID]string{}
	for i, st := range []string{
		order.StatusPending, order.StatusConfirmed, order.StatusCancelled, order.StatusCancelled, order.StatusCancelled,
		order.StatusCancelled, order.StatusRejected, order.StatusRejected, order.StatusConfirmed, order.StatusCancelled,
		order.StatusExpired, order.StatusExpired,
	} {
		want[s[i].o.ID] = st
	}
	got := map[uuid.UUID]string{}
	for _, row := range apptest.Rows(t, set, `SELECT id, status FROM orders`) {
		got[row[0].(uuid.UUID)] = row[1].(string)
	}
	require.Equal(t, want, got)
	var reasons []string
	for _, row := range apptest.Rows(t, set, `SELECT reason FROM order_timeline WHERE event_type = '`+string(event.OrderCancelled)+`' ORDER BY order_id`) {
		reasons = append(reasons, row[0].(string))
	}
	require.Equal(t, []string{order.ReasonPaymentRefunded, "no pears, early", "no apples", order.ReasonPaymentRefunded, order.ReasonPaymentRefunded}, reasons)

	// The fates of the late replies (docs/saga.md).
	fates := map[string]string{}
	for _, row := range apptest.Rows(t, set, `SELECT t.order_id, t.event_type, t.late FROM order_timeline t
		WHERE t.order_id = ANY ('{`+s[10].o.ID.String()+`,`+s[11].o.ID.String()+`}') OR (t.order_id = '`+s[5].o.ID.String()+`' AND t.event_type = '`+string(event.StockRejected)+`')`) {
		fates[fmt.Sprint(row[0], " ", row[1])] = row[2].(string)
	}
	fate := func(i int, typ event.Type) string { return fmt.Sprint(s[i].o.ID, " ", typ) }
	require.Equal(t, map[string]string{
		fate(10, event.PaymentDebited):  order.LateRefunded,
		fate(10, event.StockReserved):   order.LateReleased,
		fate(11, event.PaymentRejected): order.LateUnchanged,
		fate(11, event.PaymentDebited):  order.LateRefunded,
		fate(11, event.StockRejected):   order.LateUnchanged,
		// Cancelled by its refund earlier in the same batch.
		fate(5, event.StockRejected): order.LateUnchanged,
	}, fates)
}

// TestBatchEqualsEventByEvent runs random interleavings of sagas, with
// duplicates, re-emitted and late events, in random batches through
// HandleBatch and event by event through the handlers, and requires the same
// effect.
func TestBatchEqualsEventByEvent(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			ref, set := newDatabase(t), newDatabase(t)
			evs := randomSagas(rng, seedOrders(t, 30, ref, set))
			requireBatchEqualsEventByEvent(t, ref, set, apptest.RandomBatches(rng, evs))

			var statuses []string
			for _, row := range apptest.Rows(t, set, `SELECT DISTINCT status FROM orders ORDER BY status`) {
				statuses = append(statuses, row[0].(string))
			}
			require.Equal(t, []string{order.StatusCancelled, order.StatusConfirmed, order.StatusPaid, order.StatusPending, order.StatusRejected}, statuses)
		})
	}
}

// randomSagas returns the events of one random saga per order, interleaved
// at random, each order's in saga order; some events come again, under
// their own id or a new one, and some come late.
func randomSagas(rng *rand.Rand, sagas []saga) []event.Envelope {
	stories := make([][]event.Envelope, len(sagas))
	for i, s := range sagas {
		refused, refusedToo := s.stockRejected(fmt.Sprint("no stock ", i)), s.stockRejected(fmt.Sprint("no stock either ", i))
		if rng.IntN(2) == 0 {
			refusedToo.Time = refused.Time // a tie, broken by event id
		} else {
			refusedToo = earlier(refusedToo, time.Second)
		}
		story := [][]event.Envelope{
			{s.debited(), s.reserved()},
			{s.reserved(), s.debited()},
			{s.paymentRejected("insufficient funds")},
			{s.paymentRejected("")},
			{s.debited(), refused, s.refunded()},
			{s.debited(), s.refunded(), refused},
			{s.debited(), refused, refusedToo, s.refunded()},
			{s.debited(), refused, s.refunded(), refusedToo},
			{s.stockRejected(""), s.refunded()},
			{refused},
			{s.debited()},
			{},
		}[rng.IntN(12)]
		for range rng.IntN(3) {
			late := []event.Envelope{s.debited(), s.paymentRejected("late"), s.refunded(), s.reserved(), s.stockRejected("late")}[rng.IntN(5)]
			story = append(story, late)
		}
		for j := range story {
			if rng.IntN(8) == 0 {
				again := story[rng.IntN(j+1)]
				if rng.IntN(2) == 0 {
					again = reemitted(again)
				}
				story = append(story, again)
			}
			if rng.IntN(2) == 0 {
				story[j].TraceParent = fmt.Sprintf("00-%032x-%016x-01", rng.Uint64(), rng.Uint64()|1)
			}
		}
		stories[i] = story
	}
	var evs []event.Envelope
	for {
		var left []int
		for i, story := range stories {
			if len(story) > 0 {
				left = append(left, i)
			}
		}
		if len(left) == 0 {
			return evs
		}
		i := left[rng.IntN(len(left))]
		evs = append(evs, stories[i][0])
		stories[i] = stories[i][1:]
	}
}

// TestSetBasedConsumerEqualsPerEvent sends the same events to the service
// with and without its set-based batch handlers, in phases of one stream
// each (within a stream the consumer keeps stream order; across streams the
// order would be a race), published at once so that they share batches, and
// requires the same effect.
func TestSetBasedConsumerEqualsPerEvent(t *testing.T) {
	t.Parallel()
	set, ref := start(t), start(t, apptest.PerEvent)
	s := seedOrders(t, 9, ref.DB.Pool, set.DB.Pool)

	o4Refund, o1Debit, o2Reserved := s[4].refunded(), s[1].debited(), s[2].reserved()
	phases := []struct {
		durable string
		events  []event.Envelope
		copies  []event.Envelope // under fresh Nats-Msg-Ids: inbox duplicates
	}{
		{streams.OrderPayments, []event.Envelope{
			o1Debit, s[2].debited(), s[3].paymentRejected("insufficient funds"),
			s[4].debited(), o4Refund, reemitted(o4Refund),
			s[5].debited(), s[6].debited(), s[7].refunded(), s[8].debited(),
		}, []event.Envelope{o1Debit, o4Refund}},
		{streams.OrderInventory, []event.Envelope{
			s[1].reserved(), o2Reserved, s[5].stockRejected("out of stock: pear"),
			earlier(s[6].stockRejected("no apples"), time.Second), s[6].stockRejected("no pears"),
			s[7].stockRejected("too late"), s[3].reserved(), reemitted(o2Reserved), s[0].stockRejected("no stock"),
		}, nil},
		{streams.OrderPayments, []event.Envelope{
			s[5].refunded(), s[6].refunded(), s[1].refunded(), reemitted(s[3].paymentRejected("again")),
			s[8].paymentRejected("after the debit"),
		}, nil},
		{streams.OrderInventory, []event.Envelope{s[8].reserved()}, nil},
	}
	consumed := map[string]int{}
	for _, p := range phases {
		consumed[p.durable] += len(p.events)
		for _, svc := range []*apptest.Service{set, ref} {
			publishAtOnce(t, svc, p.events, p.copies)
		}
		for _, svc := range []*apptest.Service{set, ref} {
			awaitConsumed(t, svc, p.durable, consumed[p.durable])
		}
	}
	requireSameEffect(t, ref.DB.Pool, set.DB.Pool)
	require.Equal(t, order.StatusCancelled, get(t, set, s[6].o.ID).Status)
}

// publishAtOnce publishes evs, then copies under fresh Nats-Msg-Ids, without
// waiting for each ack, so that the consumer fetches them together.
func publishAtOnce(t *testing.T, svc *apptest.Service, evs, copies []event.Envelope) {
	t.Helper()
	for i, ev := range slices.Concat(evs, copies) {
		msg, err := ev.Msg()
		require.NoError(t, err)
		if i >= len(evs) {
			msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
		}
		_, err = svc.JS.PublishMsgAsync(msg)
		require.NoError(t, err)
	}
	select {
	case <-svc.JS.PublishAsyncComplete():
	case <-t.Context().Done():
	}
}

// awaitConsumed waits until the consumer durable processed n events.
func awaitConsumed(t *testing.T, svc *apptest.Service, durable string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := count(t.Context(), svc, "SELECT 1 FROM processed_events WHERE consumer = $1", durable)
		return err == nil && got >= n
	}, 20*time.Second, 20*time.Millisecond, "%s did not process %d events", durable, n)
}

// TestBatchWithUnknownOrderFails checks that HandleBatch fails when an
// event's order does not exist: the inbox then falls back to the handler per
// event, which refuses that event alone.
func TestBatchWithUnknownOrderFails(t *testing.T) {
	t.Parallel()
	db := newDatabase(t)
	s := seedOrders(t, 2, db)
	unknown := saga{t, order.Order{ID: uuid.New(), CustomerID: "ghost", Items: s[0].o.Items, TotalCents: s[0].o.TotalCents}}

	tx, err := db.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	err = apptest.ApplyBatch(t.Context(), tx, order.New(db).HandleBatch, []event.Envelope{s[0].reserved(), unknown.reserved(), s[1].reserved()})
	require.ErrorContains(t, err, "unknown order "+unknown.o.ID.String())
}

// TestBadEventOfABatchIsDeadLetteredAlone sends events of several orders with
// one for an unknown order among them, at once, so that they share a batch:
// the bad one is dead-lettered, the others applied.
func TestBadEventOfABatchIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+">")
		s := seedOrders(t, 6, svc.DB.Pool)

		var evs []event.Envelope
		for _, o := range s {
			evs = append(evs, o.debited())
		}
		unknown := saga{t, order.Order{ID: uuid.New(), CustomerID: "ghost", Items: s[0].o.Items, TotalCents: s[0].o.TotalCents}}
		bad := unknown.debited()
		evs = slices.Insert(evs, 3, bad)
		evs = append(evs, s[0].refunded())
		publishAtOnce(t, svc, evs, nil)

		require.Equal(t, bad.ID, dlq.Wait(t, 1)[0].ID)
		awaitConsumed(t, svc, streams.OrderPayments, len(evs)-1)
		for i, o := range s {
			want := order.StatusPaid
			if i == 0 {
				want = order.StatusCancelled
			}
			require.Equal(t, want, get(t, svc, o.o.ID).Status, "order %d", i)
		}
		require.Len(t, dlq.Seen(), 1)
		require.Zero(t, countRows(t, svc, "SELECT 1 FROM order_timeline WHERE order_id = $1", unknown.o.ID))
		require.Equal(t, len(evs)-1, countRows(t, svc, "SELECT 1 FROM processed_events WHERE consumer = $1", streams.OrderPayments))
	})
}

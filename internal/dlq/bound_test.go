package dlq_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/dlq/dlqtest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// sagaEnv is the saga's topology on a NATS server that checks who is
// calling: each party connects with its own natsauth identity. payment's
// inbox consumes payment-orders and records each OrderPlaced's total; it
// fails the events poisoned.
type sagaEnv struct {
	nats     *testenv.NATS
	db       *testenv.Database
	topology streams.Topology
	admin    jetstream.JetStream // the test's own view, for checks only
	order    jetstream.JetStream
	notify   jetstream.JetStream
	payment  jetstream.JetStream
	store    *dlq.Store // the operator's

	mu      sync.Mutex
	poison  map[uuid.UUID]bool
	refused map[uint64]int // payment's refused dead-letterings, by delivery
}

// refusals counts the dead-letterings the DLQ refused payment's inbox.
type refusals struct{ e *sagaEnv }

func (r refusals) Handle(ctx context.Context, _ event.Envelope) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (r refusals) HandleBatch(ctx context.Context, _ []event.Envelope) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (r refusals) Transaction(int, time.Duration, error) {}

func (r refusals) Settled(_ event.Envelope, outcome inbox.Outcome, deliveries uint64) {
	if outcome == inbox.OutcomeDeadLetterRefused {
		r.e.mu.Lock()
		defer r.e.mu.Unlock()
		r.e.refused[deliveries]++
	}
}

func (e *sagaEnv) refusedOn(delivery uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.refused[delivery]
}

func (e *sagaEnv) setPoison(id uuid.UUID, on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.poison[id] = on
}

func setupSaga(t *testing.T) *sagaEnv {
	t.Helper()
	return setupSagaWith(t, streams.Config{})
}

// setupSagaWith is setupSaga with cfg's settings of the topology.
func setupSagaWith(t *testing.T, cfg streams.Config) *sagaEnv {
	t.Helper()
	ctx := t.Context()
	n := testenv.NewNATS(t)
	require.True(t, n.Embedded(), "the identities need testenv's embedded server")
	cfg.Storage, cfg.InboxRetention = jetstream.MemoryStorage, retention
	e := &sagaEnv{
		nats: n, db: testenv.NewServiceDatabase(t, ""), poison: map[uuid.UUID]bool{},
		topology: streams.Saga(cfg), refused: map[uint64]int{},
	}
	_, err := e.db.Pool.Exec(ctx, `CREATE TABLE charges (event_id uuid NOT NULL, total_cents bigint NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, natsauth.Provision(ctx, n.Client(streams.Provisioner), e.topology))
	e.admin = n.JetStream(t)
	e.order, e.notify, e.payment = e.as(t, "order"), e.as(t, "notify"), e.as(t, "payment")
	e.store = dlq.New(e.as(t, streams.Operator), dlq.Config{Topology: e.topology})

	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := inbox.New(e.db.Pool, e.payment, inbox.Config{
		Stream: streams.Orders, Durable: streams.PaymentOrders, NakDelay: 50 * time.Millisecond,
		Retention: retention, Topology: &e.topology, Observer: refusals{e},
	}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		e.mu.Lock()
		poisoned := e.poison[ev.ID]
		e.mu.Unlock()
		if poisoned {
			return inbox.Permanent(fmt.Errorf("poisoned %s", ev.ID))
		}
		var p event.OrderPlacedV1
		if err := ev.Decode(&p); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO charges (event_id, total_cents) VALUES ($1, $2)`, ev.ID, p.TotalCents)
		return err
	}, logger)
	run(t, c)
	return e
}

func (e *sagaEnv) as(t *testing.T, identity string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.nats.ConnAs(t, identity))
	require.NoError(t, err)
	return js
}

// place publishes, as the order service, an OrderPlaced of total cents for
// customer, poisoned for payment if poisoned, and returns it with its
// sequence in ORDERS.
func (e *sagaEnv) place(t *testing.T, customer string, total int64, poisoned bool) (event.Envelope, uint64) {
	t.Helper()
	ev := orderPlaced(t, customer, total)
	e.setPoison(ev.ID, poisoned)
	msg, err := ev.Msg()
	require.NoError(t, err)
	ack, err := e.order.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	return ev, ack.Sequence
}

func orderPlaced(t *testing.T, customer string, total int64) event.Envelope {
	t.Helper()
	ev, err := event.New("order", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: customer},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: total}},
		TotalCents: total,
	})
	require.NoError(t, err)
	return ev
}

// forge writes, as js, a dead letter of ev on dlq.<written> whose headers
// name durable, stream ORDERS and seq, with extra headers.
func forge(t *testing.T, js jetstream.JetStream, ev event.Envelope, written, durable string, seq uint64, extra nats.Header) uint64 {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	h := dlqtest.Headers(msg, streams.Orders, seq, durable, "forged")
	for k, v := range extra {
		h[k] = v
	}
	return dlqtest.Write(t, js, written, h, msg.Data)
}

func (e *sagaEnv) ordersLastSeq(t *testing.T) uint64 {
	t.Helper()
	st, err := e.admin.Stream(t.Context(), streams.Orders)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	return info.State.LastSeq
}

func (e *sagaEnv) charges(t *testing.T) map[uuid.UUID]int64 {
	t.Helper()
	rows, err := e.db.Pool.Query(t.Context(), `SELECT event_id, total_cents FROM charges`)
	require.NoError(t, err)
	out := map[uuid.UUID]int64{}
	var id uuid.UUID
	var total int64
	_, err = pgx.ForEachRow(rows, []any{&id, &total}, func() error { out[id] = total; return nil })
	require.NoError(t, err)
	return out
}

// notify, which publishes no event, writes on its own DLQ subject an
// OrderPlaced for bob that names payment-orders: the operator sees it as
// unreplayable, and replaying it, forced or not, publishes nothing. Entries
// that name notify-orders itself but no original of theirs are unverified:
// refused unless forced.
func TestAForgedDeadLetterChangesNothing(t *testing.T) {
	t.Parallel()
	e := setupSaga(t)
	ctx := t.Context()
	real, seq := e.place(t, "alice", 10, false)
	require.Eventually(t, func() bool { return len(e.charges(t)) == 1 }, waitFor, tick)

	bob := orderPlaced(t, "bob", 4000)
	forged := forge(t, e.notify, bob, streams.NotifyOrders, streams.PaymentOrders, seq, nil)
	override := nats.Header{dlq.HeaderReplayPastRetention: []string{"true"}}
	unverified := map[uint64]string{
		forge(t, e.notify, bob, streams.NotifyOrders, streams.NotifyOrders, seq, override):     "holds event",
		forge(t, e.notify, bob, streams.NotifyOrders, streams.NotifyOrders, seq+100, override): "never stored",
	}
	before := e.ordersLastSeq(t)

	entry, err := e.store.Get(ctx, forged)
	require.NoError(t, err)
	require.Equal(t, streams.NotifyOrders, entry.Consumer, "the entry's consumer is its DLQ subject's")
	require.Contains(t, entry.Unreplayable, `names "payment-orders"`)
	require.False(t, entry.Verified)
	page, err := e.store.List(ctx, dlq.Filter{})
	require.NoError(t, err)
	require.Len(t, page.Entries, 3)
	require.Equal(t, entry.Unreplayable, page.Entries[0].Unreplayable, "listed as unreplayable too")
	for _, force := range []bool{false, true} {
		_, err = e.store.Replay(ctx, forged, dlq.ReplayOptions{By: "ops", Force: force, PastRetention: force})
		var refused *dlq.RefusedError
		require.ErrorAs(t, err, &refused, "forced: %v", force)
		require.Contains(t, refused.Reason, "unreplayable")
	}

	for id, why := range unverified {
		entry, err := e.store.Get(ctx, id)
		require.NoError(t, err)
		require.Empty(t, entry.Unreplayable)
		require.Contains(t, entry.Unverified, why)
		_, err = e.store.Replay(ctx, id, dlq.ReplayOptions{By: "ops"})
		var refused *dlq.RefusedError
		require.ErrorAs(t, err, &refused)
		require.Contains(t, refused.Reason, "not verifiable")
	}
	require.Equal(t, before, e.ordersLastSeq(t), "nothing was published")
	require.Equal(t, map[uuid.UUID]int64{real.ID: 10}, e.charges(t), "bob was not charged")
	counts, err := e.store.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, counts[streams.NotifyOrders], "refused replays leave the entries open")

	// Forced, an unverified entry's own copy goes to notify-orders alone,
	// and the action says it was not verified.
	for id := range unverified {
		a, err := e.store.Replay(ctx, id, dlq.ReplayOptions{By: "ops", Force: true})
		require.NoError(t, err)
		require.True(t, a.Unverified)
		require.Equal(t, streams.ReplaySubject("orders.placed.v1", streams.NotifyOrders), a.ReplaySubject)
		st, err := e.admin.Stream(ctx, streams.Orders)
		require.NoError(t, err)
		replayed, err := st.GetMsg(ctx, a.ReplaySeq)
		require.NoError(t, err)
		require.Equal(t, bob.ID.String(), replayed.Header.Get(event.HeaderID))
		require.Empty(t, replayed.Header.Get(dlq.HeaderReplayPastRetention), "no override the operator did not give")
		break
	}
	require.Equal(t, map[uuid.UUID]int64{real.ID: 10}, e.charges(t))
}

// A real dead letter, written by payment's inbox, replays end to end; what
// is replayed is the original re-read from ORDERS, not the entry's copy:
// an entry payment wrote with another total and an override header
// replays the original's total, without the override.
func TestAReplayRereadsTheOriginal(t *testing.T) {
	t.Parallel()
	e := setupSaga(t)
	ctx := t.Context()
	ev, seq := e.place(t, "alice", 25, true)
	var entry dlq.Entry
	require.Eventually(t, func() bool {
		page, err := e.store.List(ctx, dlq.Filter{Consumer: streams.PaymentOrders})
		require.NoError(t, err)
		if len(page.Entries) == 0 {
			return false
		}
		entry = page.Entries[0]
		return true
	}, waitFor, tick)
	require.True(t, entry.Verified, "%+v", entry)
	require.Equal(t, seq, entry.StreamSeq)

	tampered := orderPlaced(t, "alice", 4000)
	tampered.ID, tampered.Subject, tampered.Time = ev.ID, ev.Subject, ev.Time
	id := forge(t, e.payment, tampered, streams.PaymentOrders, streams.PaymentOrders, seq,
		nats.Header{dlq.HeaderReplayPastRetention: []string{"true"}})
	shown, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.True(t, shown.Verified, "the original is there, with the entry's event id: %+v", shown)

	e.setPoison(ev.ID, false) // the fix is deployed
	a, err := e.store.Replay(ctx, id, dlq.ReplayOptions{By: "ops"})
	require.NoError(t, err)
	require.False(t, a.PastRetention)
	require.Eventually(t, func() bool { return len(e.charges(t)) == 1 }, waitFor, tick)
	require.Equal(t, map[uuid.UUID]int64{ev.ID: 25}, e.charges(t), "the original's total, not the entry's")

	st, err := e.admin.Stream(ctx, streams.Orders)
	require.NoError(t, err)
	replayed, err := st.GetMsg(ctx, a.ReplaySeq)
	require.NoError(t, err)
	original, err := st.GetMsg(ctx, seq)
	require.NoError(t, err)
	require.Equal(t, original.Data, replayed.Data)
	require.Empty(t, replayed.Header.Get(dlq.HeaderReplayPastRetention), "no override the operator did not give")
	require.Equal(t, "ops", replayed.Header.Get(dlq.HeaderReplayBy))

	// The inbox's own entry replays as a duplicate now.
	_, err = e.store.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops"})
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]int64{ev.ID: 25}, e.charges(t))
}

// Each durable has a budget of its own in the DLQ: notify filling its own,
// with entries as many and as large as it may, leaves payment's
// dead-lettering working. When payment's own budget is spent, its
// dead-lettering is refused, counted and retried — by redelivery, past the
// consumer's budget too, as the server never gives up on a message — until
// there is room.
func TestOneServiceCannotFillTheDLQForTheOthers(t *testing.T) {
	t.Parallel()
	const budget = 5
	e := setupSagaWith(t, streams.Config{DLQMaxPerConsumer: budget, MaxDeliver: 3})
	ctx := t.Context()
	for i := 0; ; i++ {
		_, err := e.notify.Publish(ctx, streams.DLQSubjectPrefix+streams.NotifyOrders, make([]byte, 15<<10))
		if err != nil {
			require.Equal(t, budget, i, "refused once its budget is spent: %v", err)
			break
		}
	}
	_, err := e.notify.Publish(ctx, streams.DLQSubjectPrefix+streams.NotifyOrders, make([]byte, 900<<10))
	require.ErrorIs(t, err, jetstream.ErrStreamMessageExceedsMaximum, "an entry's size is bounded too")

	ev, seq := e.place(t, "alice", 10, true)
	var entry dlq.Entry
	require.Eventually(t, func() bool {
		page, err := e.store.List(ctx, dlq.Filter{Consumer: streams.PaymentOrders})
		require.NoError(t, err)
		if len(page.Entries) == 1 {
			entry = page.Entries[0]
		}
		return len(page.Entries) == 1
	}, waitFor, tick)
	require.Equal(t, ev.ID.String(), entry.EventID)
	require.Equal(t, seq, entry.StreamSeq)
	require.Zero(t, e.refusedOn(1))

	// payment spends the rest of its own budget.
	for range budget - 1 {
		_, err := e.payment.Publish(ctx, streams.DLQSubjectPrefix+streams.PaymentOrders, []byte("{}"))
		require.NoError(t, err)
	}
	held, _ := e.place(t, "alice", 20, true)
	require.Eventually(t, func() bool { return e.refusedOn(4) >= 1 }, waitFor, tick,
		"refused on each delivery, and redelivered past the budget of 3")
	for n := uint64(1); n <= 3; n++ {
		require.Equal(t, 1, e.refusedOn(n), "delivery %d", n)
	}

	// Room again (an administrator purges payment's spent entries): the
	// refused dead letter is stored.
	st, err := e.admin.Stream(ctx, streams.DLQ)
	require.NoError(t, err)
	require.NoError(t, st.Purge(ctx, jetstream.WithPurgeSubject(streams.DLQSubjectPrefix+streams.PaymentOrders)))
	require.Eventually(t, func() bool {
		page, err := e.store.List(ctx, dlq.Filter{Consumer: streams.PaymentOrders})
		require.NoError(t, err)
		return len(page.Entries) == 1 && page.Entries[0].EventID == held.ID.String()
	}, waitFor, tick)
}

// An event too large for the DLQ is dead-lettered without its body (the
// entry says how large it was) rather than retried for ever; its replay
// re-reads the original, body and all.
func TestABodyTooLargeForTheDLQStaysInItsStream(t *testing.T) {
	t.Parallel()
	e := setupSagaWith(t, streams.Config{DLQMaxMsgSize: 2 << 10})
	ctx := t.Context()
	var lines event.Lines
	for i := range 100 {
		lines = append(lines, event.OrderLine{SKU: fmt.Sprintf("sku-%03d", i), Quantity: 1, UnitPriceCents: 1})
	}
	ev, err := event.New("order", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order: event.Order{OrderID: uuid.New(), CustomerID: "alice"}, Lines: lines, TotalCents: 100,
	})
	require.NoError(t, err)
	require.Greater(t, len(ev.Data), 2<<10)
	e.setPoison(ev.ID, true)
	msg, err := ev.Msg()
	require.NoError(t, err)
	_, err = e.order.PublishMsg(ctx, msg)
	require.NoError(t, err)

	var id uint64
	require.Eventually(t, func() bool {
		page, err := e.store.List(ctx, dlq.Filter{Consumer: streams.PaymentOrders})
		require.NoError(t, err)
		if len(page.Entries) == 1 {
			id = page.Entries[0].ID
		}
		return id != 0
	}, waitFor, tick)
	entry, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.Empty(t, entry.Data)
	require.Equal(t, strconv.Itoa(len(ev.Data)), entry.Headers.Get(inbox.HeaderDLQBodyDropped))
	require.True(t, entry.Verified, "%+v", entry)

	e.setPoison(ev.ID, false)
	_, err = e.store.Replay(ctx, id, dlq.ReplayOptions{By: "ops"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.charges(t)[ev.ID] == 100 }, waitFor, tick)
}

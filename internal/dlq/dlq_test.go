package dlq_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/dlq/dlqtest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	gaveUp    = "payment-test" // the durable whose handler fails
	bystander = "notify-test"  // another durable on the same subject
	retention = time.Hour
	waitFor   = 30 * time.Second
	tick      = 10 * time.Millisecond
)

// env is a test's database, NATS and two inbox consumers of
// orders.placed.v1, one of which fails the events poisoned while poisoned
// is on.
type env struct {
	db       *testenv.Database
	js       jetstream.JetStream
	topology streams.Topology
	store    *dlq.Store

	mu       sync.Mutex
	poison   map[uuid.UUID]bool
	consumer map[string]*inbox.Consumer
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	e := &env{
		db:       testenv.NewServiceDatabase(t, ""),
		js:       testenv.NewNATS(t).JetStream(t),
		poison:   map[uuid.UUID]bool{},
		consumer: map[string]*inbox.Consumer{},
	}
	// The business write: one row per effect, no unique key (only the inbox
	// keeps it to one per event).
	_, err := e.db.Pool.Exec(ctx, `CREATE TABLE effects (consumer text NOT NULL, event_id uuid NOT NULL)`)
	require.NoError(t, err)
	topology := streams.Topology{
		Config:  streams.Config{Storage: jetstream.MemoryStorage, InboxRetention: retention},
		Streams: []streams.Stream{{Name: streams.Orders, Subjects: []string{"orders.>"}, Owner: "order"}},
		Consumers: []streams.Consumer{
			{Stream: streams.Orders, Durable: gaveUp, FilterSubjects: []string{"orders.placed.v1"}},
			{Stream: streams.Orders, Durable: bystander, FilterSubjects: []string{"orders.placed.v1"}},
		},
	}
	require.NoError(t, streams.Provision(ctx, e.js, topology))
	e.topology = topology
	e.store = dlq.New(e.js, dlq.Config{Topology: topology})
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, durable := range []string{gaveUp, bystander} {
		c := inbox.New(e.db.Pool, e.js, inbox.Config{Stream: streams.Orders, Durable: durable, NakDelay: 50 * time.Millisecond, Retention: retention},
			func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				e.mu.Lock()
				poisoned := durable == gaveUp && e.poison[ev.ID]
				e.mu.Unlock()
				if poisoned {
					return inbox.Permanent(fmt.Errorf("poisoned %s", ev.ID))
				}
				_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id) VALUES ($1, $2)`, durable, ev.ID)
				return err
			}, logger)
		e.consumer[durable] = c
		run(t, c)
	}
	return e
}

// run runs c until the test ends.
func run(t *testing.T, c *inbox.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func (e *env) setPoison(id uuid.UUID, on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.poison[id] = on
}

// effects counts durable's committed effects.
func (e *env) effects(t *testing.T, durable string) int {
	t.Helper()
	var n int
	err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM effects WHERE consumer = $1`, durable).Scan(&n)
	require.NoError(t, err)
	return n
}

// publish publishes a new OrderPlaced, poisoned for gaveUp if poisoned.
func (e *env) publish(t *testing.T, poisoned bool) event.Envelope {
	t.Helper()
	ev, err := event.New("order", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 10}},
		TotalCents: 10,
	})
	require.NoError(t, err)
	e.setPoison(ev.ID, poisoned)
	msg, err := ev.Msg()
	require.NoError(t, err)
	_, err = e.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	return ev
}

// awaitEntry waits for the DLQ entry of ev and returns it.
func (e *env) awaitEntry(t *testing.T, ev event.Envelope) dlq.Entry {
	t.Helper()
	var found dlq.Entry
	require.Eventually(t, func() bool {
		page, err := e.store.List(t.Context(), dlq.Filter{Consumer: gaveUp})
		require.NoError(t, err)
		for _, en := range page.Entries {
			if en.EventID == ev.ID.String() {
				found = en
				return true
			}
		}
		return false
	}, waitFor, tick)
	return found
}

func (e *env) processed(t *testing.T, durable string, id uuid.UUID) bool {
	t.Helper()
	var n int
	err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM processed_events WHERE consumer = $1 AND event_id = $2`, durable, id).Scan(&n)
	require.NoError(t, err)
	return n == 1
}

// A failed event replayed reaches the consumer that gave up on it, and only
// it, with the same id; the entry is marked replayed, and a second replay
// is refused.
func TestReplayOfAFailedEventCompletesIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	ev := e.publish(t, true)
	entry := e.awaitEntry(t, ev)
	require.Equal(t, dlq.Open, entry.Status())
	require.Contains(t, entry.Reason, "poisoned")
	require.Equal(t, streams.Orders, entry.Stream)
	require.Equal(t, "orders.placed.v1", entry.Subject)
	require.Equal(t, string(event.OrderPlaced), entry.EventType)
	require.Eventually(t, func() bool { return e.effects(t, bystander) == 1 }, waitFor, tick)

	shown, err := e.store.Get(ctx, entry.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(ev.Data), string(shown.Data))
	require.Equal(t, uint64(1), shown.Deliveries)

	e.setPoison(ev.ID, false) // the fix is deployed
	a, err := e.store.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops@example"})
	require.NoError(t, err)
	require.Equal(t, streams.ReplaySubject("orders.placed.v1", gaveUp), a.ReplaySubject)
	require.Eventually(t, func() bool { return e.processed(t, gaveUp, ev.ID) }, waitFor, tick)
	require.Equal(t, 1, e.effects(t, gaveUp))

	// The bystander never sees the replay: its consumer is caught up with
	// one message handled.
	require.Eventually(t, func() bool { return e.consumer[bystander].Stats().Processed == 1 }, waitFor, tick)
	cons, err := e.js.Consumer(ctx, streams.Orders, bystander)
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.NumPending+uint64(info.NumAckPending))
	require.Equal(t, uint64(1), info.Delivered.Consumer, "the bystander got the original only")
	require.Equal(t, 1, e.effects(t, bystander))

	shown, err = e.store.Get(ctx, entry.ID)
	require.NoError(t, err)
	require.Equal(t, dlq.Replayed, shown.Status())
	last, _ := shown.LastAction()
	require.Equal(t, "ops@example", last.By)
	require.Equal(t, ev.ID.String(), last.EventID)

	_, err = e.store.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops@example"})
	var refused *dlq.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Contains(t, refused.Reason, "already replayed")
}

// An entry whose event was processed after all (the inbox gave up on a
// delivery whose commit had in fact happened) replays as a duplicate: the
// handler does not run again.
func TestReplayOfAProcessedEventIsADuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	ev := e.publish(t, false)
	require.Eventually(t, func() bool { return e.processed(t, gaveUp, ev.ID) }, waitFor, tick)
	id := dlqtest.DeadLetter(t, e.js, ev, streams.Orders, gaveUp, "failed on each of 10 deliveries, the last: commit: connection reset")

	_, err := e.store.Replay(ctx, id, dlq.ReplayOptions{By: "ops"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.consumer[gaveUp].Stats().Duplicates == 1 }, waitFor, tick)
	require.Equal(t, 1, e.effects(t, gaveUp), "one effect")
}

// A replay of an event older than the consumer's inbox retention is refused
// with the reason, unless forced; the forced replay says so in a header.
func TestReplayPastTheRetentionIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	ev := e.publish(t, true)
	entry := e.awaitEntry(t, ev)

	later := dlq.New(e.js, dlq.Config{Topology: e.topology, Now: func() time.Time { return time.Now().Add(retention + time.Minute) }})
	_, err := later.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops"})
	var refused *dlq.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Contains(t, refused.Reason, "beyond "+gaveUp+"'s inbox retention of 1h0m0s")
	shown, err := later.Get(ctx, entry.ID)
	require.NoError(t, err)
	require.Equal(t, dlq.Open, shown.Status(), "a refused replay changes nothing")

	a, err := later.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops", PastRetention: true})
	require.NoError(t, err)
	require.True(t, a.PastRetention)
	st, err := e.js.Stream(ctx, streams.Orders)
	require.NoError(t, err)
	msg, err := st.GetMsg(ctx, a.ReplaySeq)
	require.NoError(t, err)
	require.Equal(t, "true", msg.Header.Get(dlq.HeaderReplayPastRetention))
	require.Equal(t, ev.ID.String(), msg.Header.Get(event.HeaderID))
	require.Equal(t, string(ev.Type), msg.Header.Get(event.HeaderType))
	require.NotEqual(t, ev.ID.String(), msg.Header.Get(jetstream.MsgIDHeader))
}

func TestDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	ev := e.publish(t, true)
	entry := e.awaitEntry(t, ev)

	_, err := e.store.Discard(ctx, entry.ID, "ops", " ")
	require.Error(t, err, "a discard needs a reason")
	a, err := e.store.Discard(ctx, entry.ID, "ops", "refunded by hand")
	require.NoError(t, err)
	require.Equal(t, dlq.Discarded, a.Kind)
	_, err = e.store.Replay(ctx, entry.ID, dlq.ReplayOptions{By: "ops"})
	var refused *dlq.RefusedError
	require.ErrorAs(t, err, &refused)

	page, err := e.store.List(ctx, dlq.Filter{Status: dlq.Discarded})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	require.Equal(t, "refunded by hand", page.Entries[0].Actions[0].Reason)
	counts, err := e.store.Counts(ctx)
	require.NoError(t, err)
	require.Zero(t, counts[gaveUp])

	_, err = e.store.Get(ctx, entry.ID+100)
	require.ErrorIs(t, err, dlq.ErrNotFound)
}

// List filters and pages; ReplayAll replays a consumer's open entries.
func TestListAndReplayAll(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	var evs []event.Envelope
	for range 5 {
		evs = append(evs, e.publish(t, true))
	}
	for _, ev := range evs {
		e.awaitEntry(t, ev)
	}
	// Two pages of two and one of one.
	var ids []uint64
	f := dlq.Filter{Consumer: gaveUp, Limit: 2}
	for {
		page, err := e.store.List(ctx, f)
		require.NoError(t, err)
		for _, en := range page.Entries {
			ids = append(ids, en.ID)
		}
		if page.Next == 0 {
			break
		}
		f.After = page.Next
	}
	require.Len(t, ids, 5)
	for _, f := range []dlq.Filter{{Consumer: bystander}, {Type: string(event.PaymentDebited)}, {Reason: "no such reason"}, {Since: time.Now().Add(time.Hour)}, {OrderID: uuid.NewString()}} {
		page, err := e.store.List(ctx, f)
		require.NoError(t, err)
		require.Empty(t, page.Entries, "%+v", f)
	}
	page, err := e.store.List(ctx, dlq.Filter{Reason: "POISONED", Type: string(event.OrderPlaced), Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Len(t, page.Entries, 5)
	page, err = e.store.List(ctx, dlq.Filter{OrderID: evs[2].Subject})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	require.Equal(t, evs[2].ID.String(), page.Entries[0].EventID)
	counts, err := e.store.Counts(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, counts[gaveUp])

	for _, ev := range evs {
		e.setPoison(ev.ID, false)
	}
	results, err := e.store.ReplayAll(ctx, dlq.Filter{Consumer: gaveUp, Since: time.Now().Add(-time.Hour)}, dlq.ReplayOptions{By: "ops"})
	require.NoError(t, err)
	require.Len(t, results, 5)
	for _, ev := range evs {
		require.Eventually(t, func() bool { return e.processed(t, gaveUp, ev.ID) }, waitFor, tick)
	}
	counts, err = e.store.Counts(ctx)
	require.NoError(t, err)
	require.Zero(t, counts[gaveUp])
}

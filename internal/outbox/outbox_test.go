package outbox_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// fixture is one test's database, NATS server and JetStream client.
type fixture struct {
	db     *testenv.Database
	nats   *testenv.NATS
	js     jetstream.JetStream
	logger *slog.Logger
}

func setup(t *testing.T) *fixture {
	t.Helper()
	n := testenv.NewNATS(t)
	// As a service creates it: the client forgets a publish whose ack is
	// overdue.
	js, err := jetstream.New(n.Conn(t), jetstream.WithPublishAsyncTimeout(10*time.Second))
	require.NoError(t, err)
	return &fixture{
		db:     testenv.NewServiceDatabase(t, ""),
		nats:   n,
		js:     js,
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// provision creates the saga's streams with the given duplicate window (zero
// for the default).
func (f *fixture) provision(t *testing.T, duplicateWindow time.Duration) {
	t.Helper()
	err := streams.Provision(t.Context(), f.js, streams.Saga(streams.Config{DuplicateWindow: duplicateWindow}))
	require.NoError(t, err)
}

func (f *fixture) relay(cfg outbox.RelayConfig) *outbox.Relay {
	return outbox.NewRelay(f.db.Pool, f.js, cfg, f.logger)
}

// run runs r (a relay, or an inbox consumer) until the test ends, and then
// checks that Run returned nil.
func run(t *testing.T, r interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "Run")
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context was canceled")
		}
	})
}

// payload is what the tests' events carry: the outbox does not look into it.
type payload struct {
	Seq int `json:"seq"`
}

func newEvent(t *testing.T, typ event.Type, aggregate string, seq int) event.Envelope {
	t.Helper()
	ev, err := event.New("test", typ, aggregate, payload{Seq: seq})
	require.NoError(t, err)
	return ev
}

// orderEvents returns n OrderPlaced events of one order, in sequence.
func orderEvents(t *testing.T, n int) []event.Envelope {
	t.Helper()
	evs := make([]event.Envelope, n)
	for i := range evs {
		evs[i] = newEvent(t, event.OrderPlaced, "order-1", i+1)
	}
	return evs
}

// enqueue writes evs in one transaction and commits it.
func enqueue(t *testing.T, pool *pgxpool.Pool, evs ...event.Envelope) {
	t.Helper()
	ctx := t.Context()
	tx := testenv.Begin(t, pool)
	for _, ev := range evs {
		require.NoError(t, outbox.Enqueue(ctx, tx, ev))
	}
	require.NoError(t, tx.Commit(ctx))
}

// streamMsgs returns every message in the stream, in stream order.
func streamMsgs(t *testing.T, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	s, err := js.Stream(ctx, name)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		msgs = append(msgs, m)
	}
	return msgs
}

// requireStreamHolds checks that stream name holds each of evs once, in
// order, and nothing else, and returns its messages.
func requireStreamHolds(t *testing.T, js jetstream.JetStream, name string, evs []event.Envelope) []*jetstream.RawStreamMsg {
	t.Helper()
	msgs := streamMsgs(t, js, name)
	got := make([]string, len(msgs))
	for i, m := range msgs {
		got[i] = m.Header.Get(event.HeaderID)
	}
	want := make([]string, len(evs))
	for i, ev := range evs {
		want[i] = ev.ID.String()
	}
	require.Equal(t, want, got, "each event once, in id order")
	return msgs
}

// awaitMsgs waits until the stream holds n messages and returns how long
// that took. It fails the test after timeout.
func awaitMsgs(t *testing.T, js jetstream.JetStream, name string, n uint64, timeout time.Duration) time.Duration {
	t.Helper()
	ctx := t.Context()
	s, err := js.Stream(ctx, name)
	require.NoError(t, err)
	start := time.Now()
	for {
		info, err := s.Info(ctx)
		require.NoError(t, err)
		if info.State.Msgs >= n {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("stream %s holds %d messages after %s, want %d", name, info.State.Msgs, timeout, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// column returns the first column of the rows that sql reads.
func column[T any](t *testing.T, db *testenv.Database, sql string) []T {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), sql)
	require.NoError(t, err)
	vals, err := pgx.CollectRows(rows, pgx.RowTo[T])
	require.NoError(t, err)
	return vals
}

func requireLag(t *testing.T, r *outbox.Relay, unsent int64) outbox.Lag {
	t.Helper()
	lag, err := r.Lag(t.Context())
	require.NoError(t, err)
	require.Equal(t, unsent, lag.Unsent)
	return lag
}

func TestEnqueuePublishesCommittedEventsOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)

	rolledBack := newEvent(t, event.OrderPlaced, "order-1", 1)
	tx := testenv.Begin(t, f.db.Pool)
	require.NoError(t, outbox.Enqueue(ctx, tx, rolledBack))
	require.NoError(t, tx.Rollback(ctx))

	committed := newEvent(t, event.OrderPlaced, "order-1", 2)
	committed.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// Key order and spacing that a jsonb column would have rewritten.
	committed.Data = []byte(`{"seq":2,"a":1}`)
	enqueue(t, f.db.Pool, committed)

	r := f.relay(outbox.RelayConfig{})
	requireLag(t, r, 1)
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a sent row is not published again")
	requireLag(t, r, 0)

	msgs := streamMsgs(t, f.js, streams.Orders)
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.Equal(t, "orders.placed.v1", m.Subject)
	id := committed.ID.String()
	require.Equal(t, id, m.Header.Get(jetstream.MsgIDHeader))
	require.Equal(t, "1.0", m.Header.Get(event.HeaderSpecVersion))
	require.Equal(t, id, m.Header.Get(event.HeaderID))
	require.Equal(t, string(event.OrderPlaced), m.Header.Get(event.HeaderType))
	require.Equal(t, "test", m.Header.Get(event.HeaderSource))
	require.Equal(t, "order-1", m.Header.Get(event.HeaderSubject))
	require.Equal(t, "application/json", m.Header.Get(event.HeaderContentType))
	require.Equal(t, committed.TraceParent, m.Header.Get(event.HeaderTraceParent))
	// The payload goes out as the producer wrote it, byte for byte.
	require.Equal(t, string(committed.Data), string(m.Data))

	got, err := event.FromMsg(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, committed.ID, got.ID)
	// timestamptz keeps microseconds.
	require.WithinDuration(t, committed.Time, got.Time, time.Microsecond)

	for _, name := range []string{streams.Payments, streams.Inventory, streams.DLQ} {
		require.Empty(t, streamMsgs(t, f.js, name), name)
	}
}

func TestEnqueueRefusesInvalidEvents(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)

	tests := []struct {
		name   string
		mutate func(*event.Envelope)
	}{
		{"no subject", func(ev *event.Envelope) { ev.Subject = "" }},
		{"unknown type", func(ev *event.Envelope) { ev.Type = "onceflow.nope.v1" }},
		{"no data", func(ev *event.Envelope) { ev.Data = nil }},
		{"data not JSON", func(ev *event.Envelope) { ev.Data = json.RawMessage("{") }},
	}
	for _, tt := range tests {
		ev := newEvent(t, event.OrderPlaced, "order-1", 1)
		tt.mutate(&ev)
		tx := testenv.Begin(t, f.db.Pool)
		err := outbox.Enqueue(ctx, tx, ev)
		require.ErrorIs(t, err, event.ErrInvalid, tt.name)
		require.NoError(t, tx.Commit(ctx))
	}
	var rows int
	require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows))
	require.Zero(t, rows)
}

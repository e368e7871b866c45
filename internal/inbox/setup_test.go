package inbox_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	testStream  = "ORDERS"
	testDurable = "inbox-test"

	// waitFor bounds every awaited condition.
	waitFor = 30 * time.Second
	tick    = 10 * time.Millisecond
)

// env is one test's database, NATS server and durable consumer.
type env struct {
	db     *testenv.Database
	js     jetstream.JetStream
	logger *slog.Logger
}

// setup gives the test a database with an effects table (the business write
// of the test handlers, deliberately without a unique key: only the inbox
// keeps it to one row per event) and a NATS server with the stream
// testStream on "orders.>" and the durable testDurable configured like cons.
func setup(t *testing.T, cons streams.Consumer) *env {
	t.Helper()
	ctx := t.Context()
	db := testenv.NewServiceDatabase(t, "")
	_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (event_id uuid NOT NULL, n int NOT NULL)`)
	require.NoError(t, err)

	js := testenv.NewNATS(t).JetStream(t)
	cons.Stream, cons.Durable = testStream, testDurable
	err = streams.Provision(ctx, js, streams.Topology{
		Config:    streams.Config{Storage: jetstream.MemoryStorage},
		Streams:   []streams.Stream{{Name: testStream, Subjects: []string{"orders.>"}}},
		Consumers: []streams.Consumer{cons},
	})
	require.NoError(t, err)

	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	return &env{db: db, js: js, logger: logger}
}

// consumer returns a Consumer of the test durable; cfg's zero fields take
// quick test values.
func (e *env) consumer(cfg inbox.Config, h inbox.Handler) *inbox.Consumer {
	cfg.Stream, cfg.Durable = testStream, testDurable
	if cfg.NakDelay == 0 {
		cfg.NakDelay = 50 * time.Millisecond
	}
	return inbox.New(e.db.Pool, e.js, cfg, h, e.logger)
}

// run runs c until the test ends, and then checks that it stops cleanly.
func run(t *testing.T, c *inbox.Consumer) {
	t.Helper()
	runStoppable(t, c)
}

// runStoppable runs c until stop is called or the test ends; stop returns
// once Run has, and checks that it stopped cleanly.
func runStoppable(t *testing.T, c *inbox.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(waitFor):
				t.Errorf("Run did not return within %s of its cancellation", waitFor)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// start runs a new Consumer until the test ends.
func (e *env) start(t *testing.T, cfg inbox.Config, h inbox.Handler) *inbox.Consumer {
	t.Helper()
	c := e.consumer(cfg, h)
	run(t, c)
	return c
}

// newEvent returns a valid OrderPlaced event.
func newEvent(t *testing.T) event.Envelope {
	t.Helper()
	ev, err := event.New("test", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 2, UnitPriceCents: 25}},
		TotalCents: 50,
	})
	require.NoError(t, err)
	return ev
}

// idMintedAt returns a fresh UUIDv7 that carries the time at: an event id
// made then.
func idMintedAt(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	first := event.FirstIDAt(at)
	copy(id[:6], first[:6])
	return id
}

// msgOf returns ev's NATS message; a non-empty msgID replaces its
// Nats-Msg-Id, so that a second publish bypasses the broker's dedup.
func msgOf(t *testing.T, ev event.Envelope, msgID string) *nats.Msg {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	if msgID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return msg
}

func (e *env) publishMsg(t *testing.T, msg *nats.Msg) {
	t.Helper()
	ack, err := e.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	require.False(t, ack.Duplicate, "the broker dropped the publish as a duplicate")
}

// publish publishes ev, each time as a new message.
func (e *env) publish(t *testing.T, ev event.Envelope) {
	t.Helper()
	e.publishMsg(t, msgOf(t, ev, uuid.NewString()))
}

// writeEffect is the business write of the test handlers, an :exec as sqlc
// writes it: the inbox queues it behind the handler's next read.
func writeEffect(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	_, err := tx.Exec(ctx, "-- name: WriteEffect :exec\nINSERT INTO effects (event_id, n) VALUES ($1, 1)", ev.ID)
	return err
}

// count runs a count query on the test database.
func (e *env) count(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := e.db.Pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// effects is the number of effect rows of the event with id.
func (e *env) effects(t *testing.T, id uuid.UUID) int64 {
	t.Helper()
	n, err := e.count(t.Context(), `SELECT count(*) FROM effects WHERE event_id = $1`, id)
	require.NoError(t, err)
	return n
}

// processedBefore records ev as processed by the test durable, as its
// earlier processing would have.
func (e *env) processedBefore(t *testing.T, ev event.Envelope) {
	t.Helper()
	_, err := e.db.Pool.Exec(t.Context(),
		`INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at) VALUES ($1, $2, $3, $4, 0, uuid7_time($2))`,
		testDurable, ev.ID, string(ev.Type), ev.Time)
	require.NoError(t, err)
}

// claims is the number of processed_events rows of the test durable.
func (e *env) claims(t *testing.T) int64 {
	t.Helper()
	n, err := e.count(t.Context(), `SELECT count(*) FROM processed_events WHERE consumer = $1`, testDurable)
	require.NoError(t, err)
	return n
}

// requireSettled waits until the durable has nothing pending or unacked.
func (e *env) requireSettled(t *testing.T) {
	t.Helper()
	cons, err := e.js.Consumer(t.Context(), testStream, testDurable)
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := cons.Info(t.Context())
		require.NoError(c, err)
		assert.Zero(c, info.NumPending, "pending")
		assert.Zero(c, info.NumAckPending, "ack pending")
	}, waitFor, tick)
}

// dlqMsgs returns the messages in the DLQ stream, in order.
func (e *env) dlqMsgs(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	s, err := e.js.Stream(ctx, streams.DLQ)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		msg, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		msgs = append(msgs, msg)
	}
	return msgs
}

// requireDeadLetter checks the DLQ copy of the message at seq in the test
// stream, and returns its reason.
func requireDeadLetter(t *testing.T, dlq *jetstream.RawStreamMsg, seq uint64, deliveries int) string {
	t.Helper()
	require.Equal(t, streams.DLQSubjectPrefix+testDurable, dlq.Subject)
	h := dlq.Header
	require.Equal(t, testDurable, h.Get(inbox.HeaderDLQConsumer))
	require.Equal(t, testStream, h.Get(inbox.HeaderDLQStream))
	require.Equal(t, strconv.FormatUint(seq, 10), h.Get(inbox.HeaderDLQStreamSeq))
	require.Equal(t, strconv.Itoa(deliveries), h.Get(inbox.HeaderDLQDeliveries))
	require.Equal(t, testDurable+":"+strconv.FormatUint(seq, 10), h.Get(jetstream.MsgIDHeader))
	require.NotEmpty(t, h.Get(inbox.HeaderDLQReason))
	return h.Get(inbox.HeaderDLQReason)
}

// both runs f as two parallel subtests, unbatched and batched.
func both(t *testing.T, f func(t *testing.T, batched bool)) {
	for _, batched := range []bool{false, true} {
		name := "unbatched"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, batched)
		})
	}
}

func parseSeq(t *testing.T, s string) uint64 {
	t.Helper()
	seq, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return seq
}

package partition_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	testStream  = "ORDERS"
	testDurable = "partition-test"

	waitFor = 30 * time.Second
	tick    = 10 * time.Millisecond
)

// env is one test's database, with an effects table written by the test
// handler (no unique key: only the inbox keeps it to one row per event).
type env struct {
	db     *testenv.Database
	js     jetstream.JetStream
	logger *slog.Logger
}

func setup(t *testing.T, db *testenv.Database) *env {
	t.Helper()
	if db == nil {
		db = testenv.NewServiceDatabase(t, "")
	}
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE effects (event_id uuid NOT NULL)`)
	require.NoError(t, err)
	return &env{db: db, logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))}
}

// withNATS gives e a NATS server with the stream testStream and the durable
// testDurable.
func (e *env) withNATS(t *testing.T) {
	t.Helper()
	e.js = testenv.NewNATS(t).JetStream(t)
	require.NoError(t, streams.Provision(t.Context(), e.js, streams.Topology{
		Config:    streams.Config{Storage: jetstream.MemoryStorage},
		Streams:   []streams.Stream{{Name: testStream, Subjects: []string{"orders.>"}}},
		Consumers: []streams.Consumer{{Stream: testStream, Durable: testDurable, MaxDeliver: 3}},
	}))
}

// maintainer keeps the inbox and the outbox of e's database with one-second
// partitions, on the clock now.
func (e *env) maintainer(inboxRetention, outboxRetention time.Duration, now func() time.Time) (*partition.Maintainer, partition.Table, partition.Table) {
	in := partition.InboxTable(time.Second, inboxRetention, 5*time.Second)
	out := partition.OutboxTable(time.Second, outboxRetention)
	m := partition.New(e.db.Pool, partition.Config{
		Tables: []partition.Table{in, out}, LockTimeout: 50 * time.Millisecond, Attempts: 2, Now: now,
	}, e.logger)
	return m, in, out
}

// consume runs an inbox consumer of the test durable until stop is called;
// configure, when given, changes its configuration.
func (e *env) consume(t *testing.T, retention time.Duration, configure ...func(*inbox.Config)) (c *inbox.Consumer, stop func()) {
	t.Helper()
	cfg := inbox.Config{Stream: testStream, Durable: testDurable, Retention: retention, NakDelay: 50 * time.Millisecond}
	for _, f := range configure {
		f(&cfg)
	}
	c = inbox.New(e.db.Pool, e.js, cfg, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.ID)
		return err
	}, e.logger)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Errorf("Run did not return within %s of its cancellation", waitFor)
		}
	}
	t.Cleanup(stop)
	return c, stop
}

// eventMintedAt returns a valid OrderPlaced event whose id and time are at.
func eventMintedAt(t *testing.T, at time.Time) event.Envelope {
	t.Helper()
	ev, err := event.New("order", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 25}},
		TotalCents: 25,
	})
	require.NoError(t, err)
	first := event.FirstIDAt(at)
	copy(ev.ID[:6], first[:6])
	ev.Time = at
	return ev
}

// publish publishes ev as a new message each time, past the broker's dedup.
func (e *env) publish(t *testing.T, ev event.Envelope) {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
	_, err = e.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

func (e *env) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n))
	return n
}

// partitionOf is the partition that holds the inbox row of event id.
func (e *env) partitionOf(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var name string
	require.NoError(t, e.db.Pool.QueryRow(t.Context(),
		`SELECT tableoid::regclass::text FROM processed_events WHERE consumer = $1 AND event_id = $2`, testDurable, id).Scan(&name))
	return name
}

func (e *env) exists(t *testing.T, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, e.db.Pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok))
	return ok
}

func awaitStats(t *testing.T, c *inbox.Consumer, want inbox.Stats) {
	t.Helper()
	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, want, c.Stats())
	}, waitFor, tick)
}

// awaitLockWaits waits until n sessions of e's database wait for a lock.
func (e *env) awaitLockWaits(t *testing.T, n int) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var waiting int
		assert.NoError(c, e.db.Pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		assert.Equal(c, n, waiting)
	}, waitFor, tick)
}

// dropLegacyPartition drops processed_events_legacy, the migration's
// partition FROM (MINVALUE), so that old events land in partitions the
// maintenance makes, as they do once the migration is a retention behind.
func (e *env) dropLegacyPartition(t *testing.T) {
	t.Helper()
	_, err := e.db.Pool.Exec(t.Context(), `SELECT partition_drop('processed_events', 'processed_events_legacy', '1s', NULL)`)
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(t.Context(), `SELECT partition_drop_detached('processed_events')`)
	require.NoError(t, err)
}

// requireDeadLettered waits until c dead-lettered ev, published again, with
// a reason that contains reason, and checks that the event had its one
// effect and no claim.
func (e *env) requireDeadLettered(t *testing.T, c *inbox.Consumer, ev event.Envelope, reason string) {
	t.Helper()
	awaitStats(t, c, inbox.Stats{DeadLettered: 1})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID), "effects of the event")
	require.Zero(t, e.count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, ev.ID))
	dlq, err := e.js.Stream(t.Context(), streams.DLQ)
	require.NoError(t, err)
	entry, err := dlq.GetLastMsgForSubject(t.Context(), streams.DLQSubjectPrefix+testDurable)
	require.NoError(t, err)
	require.Contains(t, entry.Header.Get(inbox.HeaderDLQReason), reason)
	require.Contains(t, entry.Header.Get(inbox.HeaderDLQReason), "beyond the inbox retention")
}

// detachLowest detaches the lowest partition of processed_events but
// DEFAULT and the migration's, and raises the floor past it, as
// partition_drop does in the same transaction, and returns its name: a
// leftover a drop leaves when its process stops between the detach and the
// drop.
func (e *env) detachLowest(t *testing.T) string {
	t.Helper()
	var part string
	var hi time.Time
	require.NoError(t, e.db.Pool.QueryRow(t.Context(),
		`SELECT name, hi FROM partitions_of('processed_events') WHERE NOT is_default ORDER BY lo LIMIT 1`).Scan(&part, &hi))
	_, err := e.db.Pool.Exec(t.Context(), `ALTER TABLE processed_events DETACH PARTITION `+pgx.Identifier{part}.Sanitize())
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(t.Context(), `SELECT partition_floor_raise('processed_events', $1)`, hi)
	require.NoError(t, err)
	return part
}

package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/testenv"
)

// requireOracle checks the relay's invariants against what the broker saw
// (published, by event id): no row is covered by the relay's position (not
// in outbox_unsent) that was not published, and no row was neither
// published nor unsent, that is, lost. Run it once the relay is idle.
func requireOracle(t *testing.T, db *testenv.Database, published map[string]int) {
	t.Helper()
	written := column[string](t, db, `SELECT event_id::text FROM outbox ORDER BY id`)
	unsent := map[string]bool{}
	for _, id := range column[string](t, db, `SELECT event_id::text FROM outbox_unsent`) {
		unsent[id] = true
	}
	for _, id := range written {
		switch {
		case !unsent[id] && published[id] == 0:
			t.Errorf("event %s is recorded as sent but was never published", id)
		case unsent[id] && published[id] > 0:
			// Published, not yet recorded: only while the relay runs.
			t.Errorf("event %s was published and is unsent with the relay idle", id)
		}
	}
}

// A claim that fails on the server, carrying the record of the batch
// before it, while a later batch is in flight: the later batch's record,
// sent alone, covers the rows of both, both acknowledged, and nothing is
// covered that was not published, nor hidden. (A per-row mark riding with
// the failed claim lost the first batch's marks under a later position.)
func TestAClaimCancelledWithARecordLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	evs := orderEvents(t, 7)
	enqueue(t, f.db.Pool, evs...)

	r := f.relay(outbox.RelayConfig{BatchSize: 2, Pipelined: true})
	blocked := false
	var cancelled sync.WaitGroup
	outbox.SetAfterPublish(r, func() error {
		if blocked {
			return nil
		}
		blocked = true
		// The next claim carries this batch's record; it reads
		// outbox_redrive (outbox_position), which the hold keeps
		// locked until the claim is cancelled on the server.
		hold := testenv.Begin(t, f.db.Pool)
		_, err := hold.Exec(ctx, `LOCK TABLE outbox_redrive IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		cancelled.Go(func() {
			defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
			assert.Eventually(t, func() bool {
				var n int
				err := f.db.Pool.QueryRow(ctx, `SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%name: Claim %'`).Scan(&n)
				return err == nil && n == 1
			}, 10*time.Second, 5*time.Millisecond, "a claim waiting for the hold")
		})
		return nil
	})
	_, err := r.Flush(ctx)
	cancelled.Wait()
	require.ErrorContains(t, err, "canceling statement")
	requireOracle(t, f.db, published())

	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Positive(t, n)
	requireLag(t, r, 0)
	counts := published()
	for _, ev := range evs {
		require.GreaterOrEqual(t, counts[ev.ID.String()], 1, "publishes of %s", ev.ID)
	}
	requireOracle(t, f.db, counts)
	var all bool
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT outbox_all_sent('-infinity', 'infinity', now() + interval '1 hour')`).Scan(&all))
	require.True(t, all, "every row's partition may go once past the retention")
}

// A database restored into another cluster (pg_dump and restore, a
// promoted logical replica) keeps a position and xact_ids that are another
// cluster's transaction ids, ahead of this one's here: rows written after
// the restore lie below that position. The relay sees that the position is
// not this cluster's and starts over from the rows, publishing every row
// kept again, once, and then the new ones.
func TestARelayOnARestoredDatabaseStartsOverFromTheRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	before := orderEvents(t, 3)
	enqueue(t, f.db.Pool, before...)
	n, err := f.relay(outbox.RelayConfig{}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(before), n)

	// The restore: the other cluster's identity and transaction ids, a
	// million ahead of this one's.
	_, err = f.db.Pool.Exec(ctx, `
		UPDATE outbox SET xact_id = (xact_id::text::bigint + 1000000)::text::xid8;
		UPDATE outbox_batch SET system_id = system_id + 1,
			snap = format('%1$s:%1$s:', pg_snapshot_xmax(snap)::text::bigint + 1000000)::pg_snapshot,
			span_snap = format('%1$s:%1$s:', pg_snapshot_xmax(snap)::text::bigint + 1000000)::pg_snapshot`)
	require.NoError(t, err)
	after := newEvent(t, event.OrderPlaced, "order-after", 1)
	enqueue(t, f.db.Pool, after)

	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	r := outbox.NewRelay(f.db.Pool, f.js, outbox.RelayConfig{}, logger)
	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(before)+1, n, "every row kept, and the new one")
	mu.Lock()
	require.Contains(t, logs.String(), "outbox relay starts over")
	require.Contains(t, logs.String(), "was recorded on cluster")
	mu.Unlock()
	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "once")
	counts := published()
	for _, ev := range before {
		require.Equal(t, 2, counts[ev.ID.String()])
	}
	require.Equal(t, 1, counts[after.ID.String()])
	requireOracle(t, f.db, counts)
}

// enqueueAndFlush writes n events of aggregates prefix-0… and requires
// that a flush of r publishes them.
func enqueueAndFlush(t *testing.T, f *fixture, r *outbox.Relay, prefix string, n int) []event.Envelope {
	t.Helper()
	evs := make([]event.Envelope, n)
	for i := range evs {
		evs[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("%s-%d", prefix, i), 1)
	}
	enqueue(t, f.db.Pool, evs...)
	sent, err := r.Flush(t.Context())
	require.NoError(t, err)
	require.Equal(t, n, sent)
	return evs
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A redrive goes back to the position recorded before the first one stamped
// at or after its time, by the order of the records: a clock that stepped
// back between two batches cannot make it skip the rows of the later one.
func TestARedriveTrustsTheOrderOfTheRecordsNotTheClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	r := f.relay(outbox.RelayConfig{})
	flush := func(prefix string) []event.Envelope { return enqueueAndFlush(t, f, r, prefix, 2) }
	first := flush("first")
	var since time.Time
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	second := flush("second")
	third := flush("third")
	// The third batch's record was stamped by a clock an hour behind.
	_, err := f.db.Pool.Exec(ctx, `UPDATE outbox_batch SET recorded_at = recorded_at - interval '1 hour'
		WHERE id = (SELECT max(id) FROM outbox_batch)`)
	require.NoError(t, err)

	redriven, err := outbox.Redrive(ctx, f.db.Pool, since)
	require.NoError(t, err)
	require.EqualValues(t, len(second)+len(third), redriven)
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(second)+len(third), n)
	counts := published()
	for _, ev := range first {
		require.Equal(t, 1, counts[ev.ID.String()])
	}
	for _, ev := range append(second, third...) {
		require.Equal(t, 2, counts[ev.ID.String()])
	}
	requireOracle(t, f.db, counts)
}

// A session whose default is REPEATABLE READ runs the relay all the same:
// the relay pins READ COMMITTED on the session it leads on, and its claims
// read positions and redrives in their own snapshot. A redrive that comes
// between a claim and its record is published again.
func TestTheRelayRunsReadCommittedWhateverTheDefault(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	cfg := f.db.Pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	published := countPublishes(t, f.nats, "orders.>")

	var since time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	first := orderEvents(t, 3)
	enqueue(t, pool, first...)
	r := outbox.NewRelay(pool, f.js, outbox.RelayConfig{BatchSize: 8}, f.logger)
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(first), n)

	second := newEvent(t, event.OrderPlaced, "second", 1)
	enqueue(t, pool, second)
	redriven := false
	outbox.SetAfterPublish(r, func() error {
		if !redriven {
			redriven = true
			var level string
			require.NoError(t, pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level))
			require.Equal(t, "repeatable read", level, "the pool's sessions")
			_, err := outbox.Redrive(ctx, pool, since)
			require.NoError(t, err)
		}
		return nil
	})
	_, err = r.Flush(ctx)
	require.NoError(t, err)
	requireLag(t, r, 0)
	counts := published()
	for _, ev := range first {
		require.Equal(t, 2, counts[ev.ID.String()], "publishes of a redriven event")
	}
	requireOracle(t, f.db, counts)
}

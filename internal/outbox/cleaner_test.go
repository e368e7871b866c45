package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// outboxEventIDs returns the event ids of the outbox rows in id order.
func outboxEventIDs(t *testing.T, db *testenv.Database) []string {
	t.Helper()
	return column[string](t, db, "SELECT event_id::text FROM outbox ORDER BY id")
}

// setSentAgo backdates the sent_at of the rows of evs.
func setSentAgo(t *testing.T, db *testenv.Database, ago time.Duration, evs ...event.Envelope) {
	t.Helper()
	for _, ev := range evs {
		tag, err := db.Pool.Exec(t.Context(),
			"UPDATE outbox SET sent_at = now() - make_interval(secs => $1) WHERE event_id = $2",
			ago.Seconds(), ev.ID)
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected())
	}
}

func TestCleanerDeletesOnlySentRowsPastRetention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)

	old1 := newEvent(t, event.OrderPlaced, "order-1", 1)
	old2 := newEvent(t, event.OrderPlaced, "order-1", 2)
	recent := newEvent(t, event.OrderPlaced, "order-1", 3)
	justSent := newEvent(t, event.OrderPlaced, "order-1", 4)
	enqueue(t, f.db.Pool, old1, old2, recent, justSent)
	n, err := f.relay(outbox.RelayConfig{}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	setSentAgo(t, f.db, 2*time.Hour, old1, old2)
	setSentAgo(t, f.db, 30*time.Minute, recent)
	// Old but never sent: the cleaner must not touch it.
	unsent := newEvent(t, event.OrderPlaced, "order-1", 5)
	enqueue(t, f.db.Pool, unsent)
	_, err = f.db.Pool.Exec(ctx, "UPDATE outbox SET created_at = now() - interval '3 hours' WHERE event_id = $1", unsent.ID)
	require.NoError(t, err)

	// Batches of one: Clean loops until a batch is short.
	c := outbox.NewCleaner(f.db.Pool, outbox.CleanerConfig{Retention: time.Hour, BatchSize: 1}, f.logger)
	deleted, err := c.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), deleted)
	require.Equal(t, []string{recent.ID.String(), justSent.ID.String(), unsent.ID.String()}, outboxEventIDs(t, f.db))
	deleted, err = c.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, deleted)

	// Run cleans on its interval and returns nil when stopped.
	setSentAgo(t, f.db, 2*time.Hour, recent)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- outbox.NewCleaner(f.db.Pool, outbox.CleanerConfig{Interval: 10 * time.Millisecond}, f.logger).Run(runCtx)
	}()
	require.Eventually(t, func() bool {
		return len(outboxEventIDs(t, f.db)) == 2
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []string{justSent.ID.String(), unsent.ID.String()}, outboxEventIDs(t, f.db))
}

func TestRedriveRepublishes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	evs := []event.Envelope{
		newEvent(t, event.OrderPlaced, "order-1", 1),
		newEvent(t, event.OrderPlaced, "order-2", 1),
	}
	enqueue(t, f.db.Pool, evs...)
	r := f.relay(outbox.RelayConfig{})
	before := time.Now().Add(-time.Minute)
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	redriven, err := outbox.Redrive(ctx, f.db.Pool, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Zero(t, redriven, "nothing was sent after since")

	redriven, err = outbox.Redrive(ctx, f.db.Pool, before)
	require.NoError(t, err)
	require.Equal(t, int64(2), redriven)
	requireLag(t, r, 2)

	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	requireLag(t, r, 0)
	// Within the duplicate window the broker drops the republished events.
	requireStreamHolds(t, f.js, streams.Orders, evs)
}

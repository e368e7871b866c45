package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// signal is a channel closed once.
type signal struct {
	once sync.Once
	c    chan struct{}
}

func newSignal() *signal { return &signal{c: make(chan struct{})} }
func (s *signal) fire()  { s.once.Do(func() { close(s.c) }) }

// wait waits for s, for a bounded time: the test goes on either way.
func (s *signal) wait() {
	select {
	case <-s.c:
	case <-time.After(5 * time.Second):
	}
}

// A batch that falls back to its per-event handlers runs them one event
// per transaction, so it cannot deadlock with another consumer's set-based
// batch over the same rows, whatever their orders: here the fallback
// handles [k=2, k=1] while the set-based batch locks 1, then 2.
func TestAFallbackCannotDeadlockWithASetBasedBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const setDurable = "inbox-test-set"
	e := setup(t, streams.Consumer{FilterSubjects: []string{"orders.fallback"}})
	_, err := e.js.CreateOrUpdateConsumer(ctx, testStream, jetstream.ConsumerConfig{
		Durable: setDurable, FilterSubject: "orders.set", AckPolicy: jetstream.AckExplicitPolicy,
	})
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(ctx, `CREATE TABLE counters (k int PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)

	key := map[uuid.UUID]int{} // event → the counter it increments
	publish := func(subject string, k int) {
		ev := newEvent(t)
		key[ev.ID] = k
		msg := msgOf(t, ev, "")
		msg.Subject = subject
		e.publishMsg(t, msg)
	}
	publish("orders.fallback", 2)
	publish("orders.fallback", 1)
	publish("orders.set", 1)
	publish("orders.set", 2)

	fallbackHolds2, setHolds1 := newSignal(), newSignal()
	increment := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		_, err := tx.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE k = $1`, key[ev.ID])
		if err == nil && key[ev.ID] == 2 {
			fallbackHolds2.fire()
			setHolds1.wait() // the set-based batch now holds 1 and wants 2
		}
		return err
	}
	refuse := func(context.Context, pgx.Tx, []event.Envelope, *postgres.Pipeline) error {
		return errors.New("the set-based form refuses this batch")
	}
	inKeyOrder := func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
		if _, err := tx.Exec(ctx, `SELECT n FROM counters WHERE k = 1 FOR UPDATE`); err != nil {
			return err
		}
		setHolds1.fire()
		fallbackHolds2.wait()
		ks := make([]int32, len(evs))
		for i, ev := range evs {
			ks[i] = int32(key[ev.ID])
		}
		_, err := tx.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE k = ANY($1)`, ks)
		return err
	}

	fallback := e.start(t, inbox.Config{Batched: true, BatchSize: 10, BatchHandler: refuse}, increment)
	set := inbox.New(e.db.Pool, e.js, inbox.Config{
		Stream: testStream, Durable: setDurable, Batched: true, BatchSize: 10, BatchHandler: inKeyOrder, NakDelay: 50 * time.Millisecond,
	}, increment, e.logger)
	run(t, set)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, inbox.Stats{Processed: 2}, fallback.Stats(), "the fallback")
		assert.Equal(c, inbox.Stats{Processed: 2}, set.Stats(), "the set-based batch")
	}, waitFor, tick)
	var deadlocks int64
	require.NoError(t, e.db.Pool.QueryRow(ctx,
		`SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks))
	require.Zero(t, deadlocks)
	n, err := e.count(ctx, `SELECT sum(n) FROM counters`)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
}

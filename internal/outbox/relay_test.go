package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// awaitListener waits until a relay's LISTEN session other than the one
// with pid notPid is established in the test's database, and returns its
// pid.
func awaitListener(t *testing.T, db *testenv.Database, notPid int32) int32 {
	t.Helper()
	var pid int32
	require.Eventually(t, func() bool {
		err := db.Pool.QueryRow(t.Context(), `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1
			  AND state = 'idle' AND pid <> $2`,
			outbox.ListenApplicationName, notPid).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 10*time.Second, 5*time.Millisecond, "relay LISTEN session")
	return pid
}

func terminateBackend(t *testing.T, db *testenv.Database, pid int32) {
	t.Helper()
	var ok bool
	// Waits up to 5s for the backend to exit.
	err := db.Pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok)
	require.NoError(t, err)
	require.True(t, ok, "terminate backend %d", pid)
}

func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	// Polling alone would take a minute.
	run(t, f.relay(outbox.RelayConfig{PollInterval: time.Minute}))
	awaitListener(t, f.db, 0)

	const events = 20
	latencies := make([]time.Duration, 0, events)
	for i := range events {
		enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", i+1))
		latencies = append(latencies, awaitMsgs(t, f.js, streams.Orders, uint64(i+1), time.Second))
	}
	slices.Sort(latencies)
	t.Logf("commit to stream over %d events: p50 %s, max %s", events, latencies[events/2], latencies[events-1])
}

// TestCommitsNotifyOnlyWhileTheRelaySleeps is the trigger's side of the
// wake-up protocol: a commit that inserts outbox rows notifies while a
// session holds the sleep lock, and not otherwise.
func TestCommitsNotifyOnlyWhileTheRelaySleeps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	listen, err := pgx.Connect(ctx, f.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listen.Close(context.Background()) })
	_, err = listen.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	notified := func() bool {
		waitCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := listen.WaitForNotification(waitCtx)
		return err == nil
	}

	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	require.False(t, notified(), "a commit notified while no relay sleeps")

	sleeper, err := f.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer sleeper.Release()
	_, err = sleeper.Exec(ctx, "SELECT pg_advisory_lock(outbox_sleep_lock_key())")
	require.NoError(t, err)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 2))
	require.True(t, notified(), "a commit did not notify the sleeping relay")

	_, err = sleeper.Exec(ctx, "SELECT pg_advisory_unlock(outbox_sleep_lock_key())")
	require.NoError(t, err)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 3))
	require.False(t, notified(), "a commit notified after the relay woke")
}

// TestNoCommitWaitsForThePoll races producers against a relay that keeps
// going to sleep and waking up: with a poll interval of a minute, every row
// must still go out within moments of its commit, by the busy loop or by a
// notification; a commit that slipped between the two would wait a minute.
func TestNoCommitWaitsForThePoll(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	run(t, f.relay(outbox.RelayConfig{PollInterval: time.Minute}))
	awaitListener(t, f.db, 0)

	const producers, perProducer = 4, 50
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 1))
			for i := range perProducer {
				ev := newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d", p), i+1)
				// Transactions of varying length, with pauses between, so
				// that commits land in every phase of the relay's loop.
				tx := testenv.Begin(t, f.db.Pool)
				require.NoError(t, outbox.Enqueue(t.Context(), tx, ev))
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				require.NoError(t, tx.Commit(t.Context()))
				time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	// Far less than the poll interval: only a lost wake-up takes longer.
	latency := awaitMsgs(t, f.js, streams.Orders, producers*perProducer, 5*time.Second)
	t.Logf("last of %d racing commits in the stream %s after the last commit", producers*perProducer, latency)
}

func TestLostNotificationIsCoveredByPolling(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	const poll = 200 * time.Millisecond
	run(t, f.relay(outbox.RelayConfig{PollInterval: poll}))
	pid := awaitListener(t, f.db, 0)

	// Open the pool's connections now: while the database refuses new
	// connections, this test uses these. The relay holds one of its own,
	// with the relay lock, from its first flush on.
	conns := make([]*pgxpool.Conn, f.db.Pool.Config().MaxConns-1)
	for i := range conns {
		c, err := f.db.Pool.Acquire(ctx)
		require.NoError(t, err)
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	// Kill the LISTEN session and keep the relay from opening another, so
	// that the next commit is notified to nobody. ALLOW_CONNECTIONS binds
	// superusers too; a database cannot disallow its own connections.
	admin, err := pgx.Connect(ctx, f.db.AdminURL())
	require.NoError(t, err)
	defer func() { require.NoError(t, admin.Close(context.Background())) }()
	allowConnections := func(allow bool) {
		_, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{f.db.Name}.Sanitize(), allow))
		require.NoError(t, err)
	}
	allowConnections(false)
	terminateBackend(t, f.db, pid)

	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	latency := awaitMsgs(t, f.js, streams.Orders, 1, 10*poll)
	t.Logf("unnotified commit to stream: %s (poll interval %s)", latency, poll)
	require.Less(t, latency, 3*poll, "published by polling within about two poll intervals")

	allowConnections(true)
	awaitListener(t, f.db, pid)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 2))
	t.Logf("commit to stream with LISTEN back: %s", awaitMsgs(t, f.js, streams.Orders, 2, time.Second))
}

func TestListenIsReestablished(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	// Polling alone would take a minute: what is published below was
	// noticed through the LISTEN session.
	run(t, f.relay(outbox.RelayConfig{PollInterval: time.Minute}))
	pid := awaitListener(t, f.db, 0)

	terminateBackend(t, f.db, pid)
	// Committed while the session is down or being re-established: the
	// relay flushes once it listens again.
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	t.Logf("commit to stream across a lost session: %s", awaitMsgs(t, f.js, streams.Orders, 1, 2*time.Second))

	awaitListener(t, f.db, pid)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 2))
	t.Logf("commit to stream on the new session: %s", awaitMsgs(t, f.js, streams.Orders, 2, time.Second))
}

func TestTwoRelaysKeepPerAggregateOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)

	var published [2]atomic.Int64
	for i := range published {
		// Small batches: many turns for the lock to change hands.
		r := f.relay(outbox.RelayConfig{BatchSize: 5, PollInterval: 100 * time.Millisecond})
		outbox.SetBatchDone(r, func(n int, _ error) { published[i].Add(int64(n)) })
		run(t, r)
	}

	const aggregates, perAggregate = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, aggregates)
	for a := range aggregates {
		wg.Go(func() {
			aggregate := fmt.Sprintf("order-%d", a)
			// One to three events per transaction, transactions one after
			// the other: the aggregate's order is its sequence numbers.
			for seq := 1; seq <= perAggregate; {
				tx, err := f.db.Pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				for range 1 + (seq+a)%3 {
					if seq > perAggregate {
						break
					}
					ev, err := event.New("test", event.OrderPlaced, aggregate, payload{Seq: seq})
					if err == nil {
						err = outbox.Enqueue(ctx, tx, ev)
					}
					if err != nil {
						_ = tx.Rollback(ctx)
						errs <- err
						return
					}
					seq++
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	const total = aggregates * perAggregate
	awaitMsgs(t, f.js, streams.Orders, total, 30*time.Second)
	r := f.relay(outbox.RelayConfig{})
	require.Eventually(t, func() bool {
		lag, err := r.Lag(ctx)
		require.NoError(t, err)
		return lag.Unsent == 0
	}, 10*time.Second, 10*time.Millisecond)
	t.Logf("published by relay 1: %d, relay 2: %d", published[0].Load(), published[1].Load())

	msgs := streamMsgs(t, f.js, streams.Orders)
	require.Len(t, msgs, total, "every event exactly once")
	last := map[string]int{}
	ids := map[string]bool{}
	for _, m := range msgs {
		id := m.Header.Get(event.HeaderID)
		require.False(t, ids[id], "event %s twice in the stream", id)
		ids[id] = true
		var p payload
		require.NoError(t, json.Unmarshal(m.Data, &p))
		aggregate := m.Header.Get(event.HeaderSubject)
		require.Equal(t, last[aggregate]+1, p.Seq, "aggregate %s out of order", aggregate)
		last[aggregate] = p.Seq
	}
	require.Len(t, last, aggregates)
}

func TestRelayDiesBeforeMarkingSent(t *testing.T) {
	t.Parallel()
	errDied := errors.New("relay died")

	t.Run("within the duplicate window", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		f := setup(t)
		f.provision(t, 0)
		evs := []event.Envelope{
			newEvent(t, event.OrderPlaced, "order-1", 1),
			newEvent(t, event.OrderPlaced, "order-1", 2),
			newEvent(t, event.OrderPlaced, "order-2", 1),
		}
		enqueue(t, f.db.Pool, evs...)

		dying := f.relay(outbox.RelayConfig{})
		outbox.SetAfterPublish(dying, func() error { return errDied })
		n, err := dying.Flush(ctx)
		require.ErrorIs(t, err, errDied)
		require.Zero(t, n)
		require.Len(t, streamMsgs(t, f.js, streams.Orders), len(evs), "published")
		fresh := f.relay(outbox.RelayConfig{})
		requireLag(t, fresh, int64(len(evs)))

		n, err = fresh.Flush(ctx)
		require.NoError(t, err)
		require.Equal(t, len(evs), n)
		requireLag(t, fresh, 0)
		requireStreamHolds(t, f.js, streams.Orders, evs)
	})

	t.Run("past the duplicate window", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		f := setup(t)
		const window = 100 * time.Millisecond // the server's minimum
		f.provision(t, window)
		ev := newEvent(t, event.OrderPlaced, "order-1", 1)
		enqueue(t, f.db.Pool, ev)

		dying := f.relay(outbox.RelayConfig{})
		outbox.SetAfterPublish(dying, func() error { return errDied })
		_, err := dying.Flush(ctx)
		require.ErrorIs(t, err, errDied)
		awaitDuplicateWindowPassed(t, f.js, "orders.probe")

		n, err := f.relay(outbox.RelayConfig{}).Flush(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		var ids []string
		for _, m := range streamMsgs(t, f.js, streams.Orders) {
			if m.Subject == "orders.placed.v1" {
				ids = append(ids, m.Header.Get(event.HeaderID))
			}
		}
		// The consumers' inbox absorbs the second one.
		require.Equal(t, []string{ev.ID.String(), ev.ID.String()}, ids)
	})
}

// awaitDuplicateWindowPassed waits until the stream of subject has forgotten
// the message ids of everything published before the call. The server
// forgets ids in the order it stored them, so it waits for a probe stored
// now to be forgotten: until a republish of the probe is stored again
// instead of being dropped as a duplicate.
func awaitDuplicateWindowPassed(t *testing.T, js jetstream.JetStream, subject string) {
	t.Helper()
	ctx := t.Context()
	probeID := fmt.Sprintf("probe-%d", time.Now().UnixNano())
	ack, err := js.Publish(ctx, subject, nil, jetstream.WithMsgID(probeID))
	require.NoError(t, err)
	require.False(t, ack.Duplicate)
	require.Eventually(t, func() bool {
		ack, err := js.Publish(ctx, subject, nil, jetstream.WithMsgID(probeID))
		require.NoError(t, err)
		return !ack.Duplicate
	}, 10*time.Second, 10*time.Millisecond, "duplicate window of %s", subject)
}

func TestPublishFailureMarksNothingAndRunKeepsGoing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t) // no streams: no stream answers a publish
	const poll = 100 * time.Millisecond

	var (
		mu       sync.Mutex
		failures []time.Time
		lastErr  error
	)
	r := f.relay(outbox.RelayConfig{PollInterval: poll, PublishTimeout: 2 * time.Second})
	outbox.SetBatchDone(r, func(_ int, err error) {
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, time.Now())
		lastErr = err
	})
	failed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(failures)
	}
	run(t, r)

	// Every commit notifies the relay; a failing relay still waits a poll
	// interval between batches.
	const rounds = 5
	for i := range rounds {
		enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", i+1))
		want := failed() + 1
		require.Eventually(t, func() bool { return failed() >= want }, 5*time.Second, 5*time.Millisecond)
	}
	mu.Lock()
	require.ErrorIs(t, lastErr, jetstream.ErrNoStreamResponse)
	for i := 1; i < len(failures); i++ {
		require.GreaterOrEqual(t, failures[i].Sub(failures[i-1]), poll, "failed batches %d and %d", i-1, i)
	}
	t.Logf("%d failed batches in %s", len(failures), failures[len(failures)-1].Sub(failures[0]))
	mu.Unlock()

	var sent int
	require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id NOT IN (SELECT id FROM outbox_unsent)").Scan(&sent))
	require.Zero(t, sent)
	requireLag(t, r, rounds)

	f.provision(t, 0)
	awaitMsgs(t, f.js, streams.Orders, rounds, 5*time.Second)
	require.Eventually(t, func() bool {
		lag, err := r.Lag(ctx)
		require.NoError(t, err)
		return lag.Unsent == 0
	}, 5*time.Second, 10*time.Millisecond)
	require.Len(t, streamMsgs(t, f.js, streams.Orders), rounds)
}

// A publish that no stream answered fails the flush at once: the client
// does not send it again by itself, which would put it behind the rows
// published after it. Here the stream is created as soon as the first
// refusal is in, well within the client's retry wait: the flush still
// fails and marks nothing, and the next flush publishes the row.
func TestAPublishNoStreamAnsweredIsNotRetriedByTheClient(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t) // no streams yet
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	r := f.relay(outbox.RelayConfig{})

	received := f.js.Conn().Stats().InMsgs
	flushed := make(chan error, 1)
	go func() {
		_, err := r.Flush(ctx)
		flushed <- err
	}()
	require.Eventually(t, func() bool { return f.js.Conn().Stats().InMsgs > received },
		10*time.Second, time.Millisecond, "the publish's refusal")
	f.provision(t, 0)
	require.ErrorIs(t, <-flushed, jetstream.ErrNoStreamResponse)
	requireLag(t, r, 1)

	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, streamMsgs(t, f.js, streams.Orders), 1)
}

func TestPublishFailureMarksOnlyThePrefixSent(t *testing.T) {
	t.Parallel()
	// One batch of three; and batches of one, where the failing row's
	// batch's acks are awaited while the batch behind it is already in
	// flight.
	for _, batchSize := range []int{0, 1} {
		t.Run(fmt.Sprintf("batch size %d", batchSize), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			f := setup(t)
			// ORDERS only: the payment event in the middle finds no stream.
			_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{
				Name:       streams.Orders,
				Subjects:   []string{"orders.>"},
				Duplicates: 2 * time.Minute,
			})
			require.NoError(t, err)
			first := newEvent(t, event.OrderPlaced, "order-1", 1)
			failing := newEvent(t, event.PaymentDebited, "order-1", 2)
			after := newEvent(t, event.OrderPlaced, "order-2", 1)
			enqueue(t, f.db.Pool, first, failing, after)

			r := f.relay(outbox.RelayConfig{BatchSize: batchSize})
			n, err := r.Flush(ctx)
			require.ErrorIs(t, err, jetstream.ErrNoStreamResponse)
			require.Equal(t, 1, n)
			require.Equal(t, []string{first.ID.String()}, sentEventIDs(t, f.db), "only the rows before the failure")
			if batchSize == 0 {
				// The row after the failure was published all the same…
				require.Len(t, streamMsgs(t, f.js, streams.Orders), 2)
			} // …in the next batch, it may or may not have been.

			f.provision(t, 0)
			n, err = r.Flush(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			requireLag(t, r, 0)
			// …and its republication was dropped by the broker.
			require.Len(t, streamMsgs(t, f.js, streams.Orders), 2)
			require.Len(t, streamMsgs(t, f.js, streams.Payments), 1)
		})
	}
}

// sentEventIDs returns the event ids of the rows marked sent, in id order.
func sentEventIDs(t *testing.T, db *testenv.Database) []string {
	t.Helper()
	return column[string](t, db, "SELECT event_id::text FROM outbox WHERE id NOT IN (SELECT id FROM outbox_unsent) ORDER BY id")
}

func TestLag(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	r := f.relay(outbox.RelayConfig{})
	require.Equal(t, outbox.Lag{}, requireLag(t, r, 0))

	for i := range 3 {
		enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", i+1))
	}
	require.Eventually(t, func() bool {
		lag := requireLag(t, r, 3)
		return lag.OldestAge > 0
	}, 5*time.Second, time.Millisecond)

	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, outbox.Lag{}, requireLag(t, r, 0))
}

func TestFlushLoopsOverBatches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const events = 23
	f, evs := pending(t, events)

	r := f.relay(outbox.RelayConfig{BatchSize: 5})
	batches := 0
	outbox.SetBatchDone(r, func(int, error) { batches++ })
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, events, n)
	require.Equal(t, 5, batches)
	requireStreamHolds(t, f.js, streams.Orders, evs)
}

// A batch of at least AtomicBatchMin rows goes to the stream as one atomic
// batch, a smaller one a message at a time; either way every event is
// stored once, in id order.
func TestLargeBatchesArePublishedAtomically(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const events = 23
	f, evs := pending(t, events)

	n, err := f.relay(outbox.RelayConfig{BatchSize: 10, AtomicBatchMin: 4}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, events, n)
	batchOf := make([]string, events)
	for i, m := range requireStreamHolds(t, f.js, streams.Orders, evs) {
		batchOf[i] = m.Header.Get("Nats-Batch-Id")
	}
	// Batches of ten, ten and three rows.
	for i := range 10 {
		require.NotEmpty(t, batchOf[i])
		require.Equal(t, batchOf[0], batchOf[i])
		require.Equal(t, batchOf[10], batchOf[10+i])
	}
	require.NotEqual(t, batchOf[0], batchOf[10])
	require.Equal(t, []string{"", "", ""}, batchOf[20:])
}

// The broker refuses a whole atomic batch that holds a message id it has
// stored, which is what a relay that died before marking its rows leaves
// behind. The relay then publishes the batch a message at a time, and the
// broker drops the copies.
func TestARefusedAtomicBatchGoesAgainAMessageAtATime(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f, evs := pending(t, 6)
	cfg := outbox.RelayConfig{BatchSize: 10, AtomicBatchMin: 4}

	dying := f.relay(cfg)
	errDied := errors.New("relay died")
	outbox.SetAfterPublish(dying, func() error { return errDied })
	_, err := dying.Flush(ctx)
	require.ErrorIs(t, err, errDied)
	require.Len(t, streamMsgs(t, f.js, streams.Orders), 6, "stored, not marked sent")
	later := orderEvents(t, 4)
	enqueue(t, f.db.Pool, later...)
	evs = append(evs, later...)

	n, err := f.relay(cfg).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)
	msgs := requireStreamHolds(t, f.js, streams.Orders, evs)
	for _, m := range msgs[:6] {
		require.NotEmpty(t, m.Header.Get("Nats-Batch-Id"), "the dying relay's atomic batch")
	}
	for _, m := range msgs[6:] {
		require.Empty(t, m.Header.Get("Nats-Batch-Id"), "published one at a time, after the refusal")
	}
}

// A batch's mark goes to the database with the next claim, in one round
// trip: a flush of five batches takes the relay lock, makes seven claims
// (two before any acks, then one after each batch's acks, the last two
// finding nothing) of which five carry a mark, and releases the lock.
// Marking on their own, it took twelve.
func TestFlushSendsEachMarkWithTheNextClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const events = 23
	f, _ := pending(t, events)

	pool, trips := tracedPool(t, f)
	n, err := outbox.NewRelay(pool, f.js, outbox.RelayConfig{BatchSize: 5, Pipelined: true}, f.logger).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, events, n)

	claimWithMark := []string{"RecordBatch", "Claim"}
	require.Equal(t, [][]string{
		{"TryRelayLock"},
		{"Claim"}, {"Claim"},
		claimWithMark, claimWithMark, claimWithMark, claimWithMark, claimWithMark,
		{"ReleaseRelayLocks"},
	}, trips.names())
	require.Len(t, streamMsgs(t, f.js, streams.Orders), events)
}

// The relay's session runs its statements with their generic plans, planned
// once, while it holds the relay lock, and goes back to the pool with the
// plan_cache_mode and synchronous_commit it had.
func TestRelayRunsGenericPlansWhileItLeads(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const events = 23
	f, _ := pending(t, events)

	cfg := f.db.Pool.Config()
	cfg.MaxConns = 1 // the relay's session is the one looked at below
	// Neither the server's default nor the relay's own setting.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "remote_apply"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	n, err := outbox.NewRelay(pool, f.js, outbox.RelayConfig{BatchSize: 5, Pipelined: true}, f.logger).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, events, n)

	var mode string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode))
	require.Equal(t, "auto", mode)
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&mode))
	require.Equal(t, "remote_apply", mode)
	rows, err := pool.Query(ctx, `
		SELECT substring(statement FROM 'name: (\w+)'), generic_plans, custom_plans
		FROM pg_prepared_statements
		WHERE statement ~ 'name: (Claim|RecordBatch) '
		ORDER BY 1`)
	require.NoError(t, err)
	type plans struct {
		Query           string
		Generic, Custom int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[plans])
	require.NoError(t, err)
	// Seven claims and five marks, as in TestFlushSendsEachMarkWithTheNextClaim.
	require.Equal(t, []plans{{"Claim", 7, 0}, {"RecordBatch", 5, 0}}, got)
}

// A relay takes its sleep lock in the round trip of the claim that must
// follow it, and releases it with the first claim after the wake-up; after
// a batch, the lock goes with the claim that carries the batch's mark. A
// commit noticed by a sleeping relay costs it two round trips (release and
// claim; sleep, mark and claim) where separate lock statements, marks and
// claims made it five.
func TestSleepAndWakeGoWithClaims(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	pool, trips := tracedPool(t, f)
	// Polling alone would take a minute.
	run(t, outbox.NewRelay(pool, f.js, outbox.RelayConfig{PollInterval: time.Minute}, f.logger))

	n := awaitSleep(t, f.db, trips, 0)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	awaitMsgs(t, f.js, streams.Orders, 1, 5*time.Second)
	awaitSleep(t, f.db, trips, n)
	require.Equal(t, [][]string{
		{"ReleaseSleepLock", "Claim"},
		{"TakeSleepLock", "RecordBatch", "Claim"},
	}, trips.names()[n:n+2], "all: %v", trips)
}

// While a producer's transaction holds the sleep lock shared, a relay that
// wants to sleep cannot: it does not get the lock in the round trip of the
// claim that carries its last mark, the mark and the claim run all the same,
// and the relay stays awake, trying again with its claims until it gets the
// lock.
func TestRelayStaysAwakeWhileCommitsHoldTheSleepLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	pool, trips := tracedPool(t, f)
	run(t, outbox.NewRelay(pool, f.js, outbox.RelayConfig{PollInterval: time.Minute}, f.logger))
	n := awaitSleep(t, f.db, trips, 0)

	// A producer in the middle of its transaction, as the outbox trigger
	// leaves it: it gets the lock shared once the relay wakes up.
	held := testenv.Begin(t, f.db.Pool)
	locked := make(chan error, 1)
	go func() {
		_, err := held.Exec(ctx, "SELECT pg_advisory_xact_lock_shared(outbox_sleep_lock_key())")
		locked <- err
	}()
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	require.NoError(t, <-locked)
	awaitMsgs(t, f.js, streams.Orders, 1, 5*time.Second)
	require.Eventually(t, func() bool {
		var unsent int
		require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_unsent").Scan(&unsent))
		return unsent == 0
	}, 5*time.Second, time.Millisecond, "the published row was not marked sent")
	// The relay tries again after a pause of its own; the try is answered
	// before the producer lets go.
	require.Eventually(t, func() bool { return len(trips.names()) >= n+3 && trips.answered() }, 5*time.Second, time.Millisecond)
	require.Equal(t, [][]string{
		{"ReleaseSleepLock", "Claim"},
		{"TakeSleepLock", "RecordBatch", "Claim"}, // the producer holds the lock
		{"TakeSleepLock", "Claim"},
	}, trips.names()[n:n+3])

	require.NoError(t, held.Rollback(ctx))
	awaitSleep(t, f.db, trips, n+3)
}

// awaitSleep waits until the relay whose round trips are trips went to sleep
// after its first n round trips (its last round trip, answered, took the
// sleep lock, which a session of db's database holds), and returns how many
// it made. The claim behind the lock must have run too: a commit between
// the two would be claimed by a relay that sleeps.
func awaitSleep(t *testing.T, db *testenv.Database, trips *roundTrips, n int) int {
	t.Helper()
	var got [][]string
	require.Eventually(t, func() bool {
		got = trips.names()
		if len(got) <= n || got[len(got)-1][0] != "TakeSleepLock" || !trips.answered() {
			return false
		}
		var held bool
		require.NoError(t, db.Pool.QueryRow(t.Context(), `
			SELECT EXISTS (SELECT FROM pg_locks
			WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted AND objsubid = 1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND (classid::bigint << 32 | objid::bigint) = outbox_sleep_lock_key())`).Scan(&held))
		return held && len(trips.names()) == len(got)
	}, 5*time.Second, time.Millisecond, "the relay did not go to sleep: %v", trips)
	return len(got)
}

// pending returns a provisioned fixture with n order events waiting in its
// outbox.
func pending(t *testing.T, n int) (*fixture, []event.Envelope) {
	t.Helper()
	f := setup(t)
	f.provision(t, 0)
	evs := orderEvents(t, n)
	enqueue(t, f.db.Pool, evs...)
	return f, evs
}

// tracedPool returns a pool of f's database whose round trips are recorded.
func tracedPool(t *testing.T, f *fixture) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	trips := &roundTrips{}
	cfg := f.db.Pool.Config()
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, trips
}

// roundTrips is a pgx tracer that records the sqlc query names of each round
// trip: a statement, or a batch of them.
type roundTrips struct {
	mu    sync.Mutex
	trips [][]string
	ended int // round trips whose answers are in
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.add(data.SQL)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) { r.end() }

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sqls := make([]string, len(data.Batch.QueuedQueries))
	for i, q := range data.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	r.add(sqls...)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     { r.end() }

func (r *roundTrips) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended++
}

// answered reports whether every round trip has its answers.
func (r *roundTrips) answered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended == len(r.trips)
}

func (r *roundTrips) add(sqls ...string) {
	names := make([]string, len(sqls))
	for i, sql := range sqls {
		first, _, _ := strings.Cut(strings.TrimPrefix(sql, "-- name: "), " ")
		names[i] = first
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, names)
}

func (r *roundTrips) names() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.trips)
}

// String lists the round trips, for failure messages, which format it only
// when they fail.
func (r *roundTrips) String() string { return fmt.Sprint(r.names()) }

func TestRunFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	const events = 3
	for i := range events {
		enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", i+1))
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := f.relay(outbox.RelayConfig{PollInterval: time.Minute})
	// Shut down after the publish and before the rows are marked sent.
	outbox.SetAfterPublish(r, func() error {
		cancel()
		return nil
	})
	require.NoError(t, r.Run(ctx))
	requireLag(t, r, 0)
	require.Len(t, streamMsgs(t, f.js, streams.Orders), events)
}

// A transaction can commit an outbox row after the relay has claimed rows
// with higher ids. The next event of that row's aggregate is written after
// the commit; it must not be published before the late row.
func TestLateCommitGoesOutBeforeItsAggregatesNextEvent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)

	late := testenv.Begin(t, f.db.Pool)
	lateFirst := newEvent(t, event.OrderPlaced, "order-late", 1)
	require.NoError(t, outbox.Enqueue(ctx, late, lateFirst)) // the lowest id, not yet committed
	others := make([]event.Envelope, 6)
	for i := range others {
		others[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d", i), 1)
	}
	enqueue(t, f.db.Pool, others...)
	lateSecond := newEvent(t, event.OrderPlaced, "order-late", 2)

	// Batches of two: when the first is acknowledged, the second is in
	// flight and the claims have gone past the late row's id.
	r := f.relay(outbox.RelayConfig{BatchSize: 2})
	committed := false
	outbox.SetAfterPublish(r, func() error {
		if !committed {
			committed = true
			// As a producer that locks the aggregate would: the next
			// event is written once the first is committed.
			require.NoError(t, late.Commit(ctx))
			enqueue(t, f.db.Pool, lateSecond)
		}
		return nil
	})
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, n, "every row marked once, by this flush")
	requireLag(t, r, 0)

	msgs := streamMsgs(t, f.js, streams.Orders)
	require.Len(t, msgs, 8)
	var lateIDs []string
	for _, m := range msgs {
		if m.Header.Get(event.HeaderSubject) == "order-late" {
			lateIDs = append(lateIDs, m.Header.Get(event.HeaderID))
		}
	}
	require.Equal(t, []string{lateFirst.ID.String(), lateSecond.ID.String()}, lateIDs)
}

// A row that commits late below rows still in flight opens the next claim's
// window over them: the claim must leave them out. A second publish of a
// row would be absorbed by the stream's duplicate window, so the test
// counts the publishes themselves, as a plain subscriber sees them.
func TestALateCommitDoesNotRepublishTheRowsInFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")

	evs := make([]event.Envelope, 8)
	for i := range evs {
		evs[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d", i), 1)
	}
	enqueue(t, f.db.Pool, evs[0])
	late := testenv.Begin(t, f.db.Pool)
	require.NoError(t, outbox.Enqueue(ctx, late, evs[1])) // the second id, not yet committed
	enqueue(t, f.db.Pool, evs[2:]...)

	// Windows of three ids: the first batch is rows 1 and 3, the second,
	// claimed at once, 4 to 6. The late row commits once the first is
	// acknowledged, and the claim that marks it starts at row 2, its window
	// reaching row 4, in flight.
	r := f.relay(outbox.RelayConfig{BatchSize: 3})
	committed := false
	outbox.SetAfterPublish(r, func() error {
		if !committed {
			committed = true
			require.NoError(t, late.Commit(ctx))
		}
		return nil
	})
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)
	requireLag(t, r, 0)

	want := make(map[string]int, len(evs))
	for _, ev := range evs {
		want[ev.ID.String()] = 1
	}
	require.Equal(t, want, published(), "publishes of each event")
}

// countPublishes subscribes to subject and returns a function that tells
// how many times each event was published on it so far, by event id.
func countPublishes(t *testing.T, n *testenv.NATS, subject string) func() map[string]int {
	t.Helper()
	nc := n.Conn(t)
	sub, err := nc.SubscribeSync(subject)
	require.NoError(t, err)
	require.NoError(t, nc.Flush()) // subscribed before anything is published
	counts := make(map[string]int)
	return func() map[string]int {
		t.Helper()
		// The server forwards a publish to subscribers before it answers
		// it; a round trip after the last answer brings in every one.
		require.NoError(t, nc.Flush())
		for {
			m, err := sub.NextMsg(0)
			if errors.Is(err, nats.ErrTimeout) {
				return counts
			}
			require.NoError(t, err)
			counts[m.Header.Get(event.HeaderID)]++
		}
	}
}

// A batch is a window of ids; ids burned by rolled-back transactions leave
// windows short, and the flush goes on past them.
func TestFlushCrossesIDGaps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))
	tx := testenv.Begin(t, f.db.Pool)
	for i := range 10 {
		require.NoError(t, outbox.Enqueue(ctx, tx, newEvent(t, event.OrderPlaced, "order-2", i+1)))
	}
	require.NoError(t, tx.Rollback(ctx))
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-3", 1))

	r := f.relay(outbox.RelayConfig{BatchSize: 2})
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	requireLag(t, r, 0)
	require.Len(t, streamMsgs(t, f.js, streams.Orders), 2)
}

// relayLockHolders returns the backends that hold an advisory lock in the
// test's database.
func relayLockHolders(t *testing.T, db *testenv.Database) []int32 {
	t.Helper()
	return column[int32](t, db, `
		SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
}

func TestFlushHoldsTheRelayLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 1))

	// A relay that holds the lock for a transaction, as relays used to,
	// keeps a flush out all the same.
	tx := testenv.Begin(t, f.db.Pool)
	var locked bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", outbox.DefaultLockKey).Scan(&locked))
	require.True(t, locked)
	n, err := f.relay(outbox.RelayConfig{}).Flush(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "another relay holds the lock")
	require.Len(t, streamMsgs(t, f.js, streams.Orders), 0)
	require.NoError(t, tx.Rollback(ctx))

	// A flush holds the lock while it runs and releases it when it ends,
	// whether it succeeded or failed: a pooled connection that kept it
	// would keep every other relay standing by.
	var holders []int32
	r := f.relay(outbox.RelayConfig{})
	outbox.SetAfterPublish(r, func() error {
		holders = relayLockHolders(t, f.db)
		return nil
	})
	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, holders, 1)
	require.Empty(t, relayLockHolders(t, f.db))

	enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", 2))
	errDied := errors.New("relay died")
	dying := f.relay(outbox.RelayConfig{})
	outbox.SetAfterPublish(dying, func() error { return errDied })
	_, err = dying.Flush(ctx)
	require.ErrorIs(t, err, errDied)
	require.Empty(t, relayLockHolders(t, f.db))
}

// A relay whose session ends (and with it the lock) marks nothing more;
// another relay takes over.
func TestRelayThatLosesItsConnectionMarksNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	evs := orderEvents(t, 4)
	enqueue(t, f.db.Pool, evs...)

	// Batches of two: the second is in flight when the session ends.
	r := f.relay(outbox.RelayConfig{BatchSize: 2})
	terminated := false
	outbox.SetAfterPublish(r, func() error {
		if !terminated {
			terminated = true
			pids := relayLockHolders(t, f.db)
			require.Len(t, pids, 1)
			terminateBackend(t, f.db, pids[0])
		}
		return nil
	})
	n, err := r.Flush(ctx)
	require.Error(t, err)
	require.Zero(t, n, "marked after its session ended")
	require.Empty(t, sentEventIDs(t, f.db))
	require.Empty(t, relayLockHolders(t, f.db))

	n, err = f.relay(outbox.RelayConfig{}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)
	requireStreamHolds(t, f.js, streams.Orders, evs)
}

// With batches of one, the batch behind the one being marked is in flight
// too when Run's context is canceled: both are marked sent, and nothing else
// is published.
func TestRunFinishesEveryBatchInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, 0)
	const events = 3
	for i := range events {
		enqueue(t, f.db.Pool, newEvent(t, event.OrderPlaced, "order-1", i+1))
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := f.relay(outbox.RelayConfig{PollInterval: time.Minute, BatchSize: 1, Pipelined: true})
	outbox.SetAfterPublish(r, func() error {
		cancel()
		return nil
	})
	require.NoError(t, r.Run(ctx))
	msgs := streamMsgs(t, f.js, streams.Orders)
	require.Len(t, msgs, 2)
	var published []string
	for _, m := range msgs {
		published = append(published, m.Header.Get(event.HeaderID))
	}
	require.Equal(t, published, sentEventIDs(t, f.db), "what was published is marked sent")
	requireLag(t, r, events-2)
}

// A panic in a flush fails it like an error: nothing it did not mark is
// marked, the relay carries on, and the next flush publishes the rows (the
// broker drops the copies).
func TestAPanicInAFlushFailsItAndRunKeepsGoing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.provision(t, time.Minute)
	r := f.relay(outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
	var panicked atomic.Bool
	outbox.SetAfterPublish(r, func() error {
		if panicked.CompareAndSwap(false, true) {
			var rows []int
			_ = rows[3] // index out of range, once
		}
		return nil
	})
	run(t, r)

	evs := []event.Envelope{newEvent(t, event.OrderPlaced, "order-1", 1), newEvent(t, event.OrderPlaced, "order-1", 2)}
	enqueue(t, f.db.Pool, evs...)
	require.Eventually(t, func() bool {
		lag, err := r.Lag(t.Context())
		require.NoError(t, err)
		return lag.Unsent == 0
	}, 10*time.Second, 10*time.Millisecond)
	require.True(t, panicked.Load())
	require.Len(t, streamMsgs(t, f.js, streams.Orders), len(evs), "published once each")
}

package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
)

func TestDuplicateDeliveriesHaveOneEffect(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		for _, consumers := range []int{1, 2} {
			for _, n := range []int{2, 5, 50} {
				t.Run(fmt.Sprintf("batched=%t/consumers=%d/deliveries=%d", batched, consumers, n), func(t *testing.T) {
					t.Parallel()
					e := setup(t, streams.Consumer{})
					var cs []*inbox.Consumer
					for range consumers {
						// Small batches and two workers each, so that the
						// copies race each other across fetches, workers and
						// consumers as well as within a batch.
						cs = append(cs, e.start(t, inbox.Config{Batched: batched, BatchSize: 4, Workers: 2}, writeEffect))
					}
					ev := newEvent(t)
					for range n {
						e.publish(t, ev)
					}

					var total inbox.Stats
					require.EventuallyWithT(t, func(c *assert.CollectT) {
						total = inbox.Stats{}
						for _, cons := range cs {
							s := cons.Stats()
							total.Processed += s.Processed
							total.Duplicates += s.Duplicates
							total.Retried += s.Retried
							total.DeadLettered += s.DeadLettered
						}
						assert.EqualValues(c, n, total.Processed+total.Duplicates)
					}, waitFor, tick)
					require.EqualValues(t, 1, e.effects(t, ev.ID), "effects of one event")
					require.Equal(t, inbox.Stats{Processed: 1, Duplicates: int64(n - 1)}, total)
					require.EqualValues(t, 1, e.claims(t))
					e.requireSettled(t)
				})
			}
		}
	}
}

// An event processed before and published again past the broker's
// duplicate window comes as a first delivery, whose claim travels with the
// handler's first statement. It is a duplicate even when its handler fails
// before sending one: the claim is sent then, and it decides.
func TestAnEventProcessedBeforeIsADuplicateWhateverItsHandlerDoes(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%t", batched), func(t *testing.T) {
			t.Parallel()
			e := setup(t, streams.Consumer{})
			old, fresh := newEvent(t), newEvent(t)
			e.processedBefore(t, old)
			e.publish(t, old)
			e.publish(t, fresh)
			c := e.start(t, inbox.Config{Batched: batched}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				if ev.ID == old.ID {
					return inbox.Permanent(errors.New("refused before any statement"))
				}
				return writeEffect(ctx, tx, ev)
			})
			require.EventuallyWithT(t, func(c2 *assert.CollectT) {
				assert.Equal(c2, inbox.Stats{Processed: 1, Duplicates: 1}, c.Stats())
			}, waitFor, tick)
			e.requireSettled(t)
			require.Empty(t, e.dlqMsgs(t))
			require.Zero(t, e.effects(t, old.ID))
			require.EqualValues(t, 1, e.effects(t, fresh.ID))
		})
	}
}

// A handler slower than the ack wait: the event is redelivered to another
// worker while its first attempt is still uncommitted. The redelivery's
// claim waits for that attempt's outcome instead of running the handler a
// second time, and once the attempt commits, the redelivery is a duplicate.
// (The end-to-end TestSlowHandler does the same under load, where whether
// the two attempts overlap is up to timing; here they always do.)
func TestARedeliveryWaitsForTheAttemptStillRunning(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{AckWait: time.Second})
		release := make(chan struct{})
		var calls atomic.Int32
		slow := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			first := calls.Add(1) == 1
			if err := writeEffect(ctx, tx, ev); err != nil {
				return err
			}
			// A statement that answers sends the claim and the effect
			// ahead of it: the claim's row exists, uncommitted.
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			if first {
				<-release
			}
			return nil
		}
		// Two workers of one message each: while one holds the first
		// attempt, the other receives the redelivery. (The first may hold
		// one redelivery received ahead; the next goes to the other.)
		c := e.start(t, inbox.Config{Batched: batched, BatchSize: 1, Workers: 2}, slow)
		releaseOnce := sync.OnceFunc(func() { close(release) })
		t.Cleanup(releaseOnce) // before the consumer's cleanup, if the test fails first
		ev := newEvent(t)
		e.publish(t, ev)

		require.Eventually(t, func() bool {
			waiting, err := e.count(t.Context(),
				`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
			return err == nil && waiting > 0
		}, waitFor, tick, "no claim waited for the first attempt")
		releaseOnce()

		require.Eventually(t, func() bool { return c.Stats().Processed == 1 && c.Stats().Duplicates >= 1 }, waitFor, tick)
		e.requireSettled(t)
		s := c.Stats()
		require.Equal(t, inbox.Stats{Processed: 1, Duplicates: s.Duplicates}, s)
		require.EqualValues(t, 1, calls.Load(), "the handler ran for a redelivery")
		require.EqualValues(t, 1, e.effects(t, ev.ID))
		require.EqualValues(t, 1, e.claims(t))
	})
}

func TestCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		// The first ack is skipped; the server redelivers after AckWait.
		e := setup(t, streams.Consumer{AckWait: time.Second})
		c := e.consumer(inbox.Config{Batched: batched}, writeEffect)
		var crashed atomic.Bool
		c.SetSkipAck(func(event.Envelope) bool { return crashed.CompareAndSwap(false, true) })
		run(t, c)

		ev := newEvent(t)
		e.publish(t, ev)

		require.Eventually(t, func() bool { return c.Stats().Duplicates == 1 }, waitFor, tick)
		require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1}, c.Stats())
		require.True(t, crashed.Load())
		require.EqualValues(t, 1, e.effects(t, ev.ID))
		e.requireSettled(t)
	})
}

func TestHandlerErrorRollsBackAndRedeliveryProcesses(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{})
		evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
		target := evs[1]

		var calls atomic.Int32
		// What the database held of the target, seen from outside the
		// transaction, when it was delivered again: -1 until then.
		leftEffects, leftClaims := atomic.Int64{}, atomic.Int64{}
		leftEffects.Store(-1)
		leftClaims.Store(-1)
		h := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if ev.ID != target.ID {
				return writeEffect(ctx, tx, ev)
			}
			if calls.Add(1) == 2 {
				n, err := e.count(ctx, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID)
				if err != nil {
					return err
				}
				leftEffects.Store(n)
				if n, err = e.count(ctx, `SELECT count(*) FROM processed_events WHERE event_id = $1`, ev.ID); err != nil {
					return err
				}
				leftClaims.Store(n)
			}
			if err := writeEffect(ctx, tx, ev); err != nil {
				return err
			}
			if calls.Load() == 1 {
				return errors.New("transient failure after the business write")
			}
			return nil
		}
		// Published before the consumer starts, so that a batch holds all.
		for _, ev := range evs {
			e.publish(t, ev)
		}
		c := e.start(t, inbox.Config{Batched: batched}, h)

		require.Eventually(t, func() bool { return c.Stats().Processed == 3 }, waitFor, tick)
		want := inbox.Stats{Processed: 3, Retried: 1}
		if batched {
			// The failed batch ran again, event by event, at once.
			want.Retried = 0
		}
		require.Equal(t, want, c.Stats())
		require.EqualValues(t, 2, calls.Load())
		require.Zero(t, leftEffects.Load(), "the failed attempt's business write was committed")
		require.Zero(t, leftClaims.Load(), "the failed attempt's inbox row was committed")
		for _, ev := range evs {
			require.EqualValues(t, 1, e.effects(t, ev.ID))
		}
		require.EqualValues(t, 3, e.claims(t))
		e.requireSettled(t)
	})
}

// TestCommitFailureIsRedelivered fails the first commit of an event: the
// handler's write violates a deferred foreign key, which PostgreSQL checks
// only at COMMIT. A consumer that acked before committing would lose it.
func TestCommitFailureIsRedelivered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{})
		_, err := e.db.Pool.Exec(t.Context(), `
			CREATE TABLE parents (id uuid PRIMARY KEY);
			CREATE TABLE children (
				parent_id uuid NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
			);`)
		require.NoError(t, err)

		evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
		target := evs[1]
		var targetCalls atomic.Int32
		h := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if err := writeEffect(ctx, tx, ev); err != nil {
				return err
			}
			// The target's first attempt writes a child without its parent.
			if ev.ID != target.ID || targetCalls.Add(1) > 1 {
				if _, err := tx.Exec(ctx, `INSERT INTO parents (id) VALUES ($1)`, ev.ID); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO children (parent_id) VALUES ($1)`, ev.ID)
			return err
		}
		for _, ev := range evs {
			e.publish(t, ev)
		}
		c := e.start(t, inbox.Config{Batched: batched}, h)

		require.Eventually(t, func() bool { return c.Stats().Processed == 3 }, waitFor, tick)
		require.EqualValues(t, 2, targetCalls.Load())
		if !batched { // batched, the failed batch ran again event by event
			require.Positive(t, c.Stats().Retried)
		}
		require.Zero(t, c.Stats().DeadLettered)
		for _, ev := range evs {
			require.EqualValues(t, 1, e.effects(t, ev.ID))
		}
		require.EqualValues(t, 3, e.claims(t))
		e.requireSettled(t)
	})
}

func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{})
		h := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			// Written first, so that a rejected event shows its rollback.
			if err := writeEffect(ctx, tx, ev); err != nil {
				return err
			}
			var p event.OrderPlacedV1
			if err := ev.Decode(&p); err != nil {
				return err // wraps event.ErrInvalid: permanent
			}
			if p.CustomerID == "mallory" {
				return inbox.Permanent(errors.New("customer is blocked"))
			}
			return nil
		}

		var valid []event.Envelope
		poison := map[uint64]string{} // stream seq → what the reason must say
		publish := func(ev event.Envelope, mutate func(*nats.Msg), reason string) {
			msg := msgOf(t, ev, "")
			if mutate == nil {
				valid = append(valid, ev)
			} else {
				mutate(msg)
			}
			ack, err := e.js.PublishMsg(t.Context(), msg)
			require.NoError(t, err)
			if mutate != nil {
				poison[ack.Sequence] = reason
			}
		}
		publish(newEvent(t), nil, "")
		publish(newEvent(t), func(m *nats.Msg) { m.Header.Del(event.HeaderSpecVersion) }, "specversion")
		publish(newEvent(t), func(m *nats.Msg) { m.Header.Set(event.HeaderID, "not-a-uuid") }, "id")
		publish(newEvent(t), func(m *nats.Msg) { m.Header.Set(event.HeaderType, "onceflow.nope.v1") }, "unknown type")
		publish(newEvent(t), func(m *nats.Msg) { m.Header.Set(event.HeaderTime, "yesterday") }, "time")
		publish(newEvent(t), func(m *nats.Msg) { m.Data = nil }, "missing data")
		publish(newEvent(t), func(m *nats.Msg) { m.Data = []byte(`{"order_id":`) }, "decode payload")
		publish(newEvent(t), func(m *nats.Msg) {
			m.Data = []byte(`{"order_id":"` + uuid.NewString() + `","customer_id":"c","lines":[{"sku":"s","quantity":1,"unit_price_cents":5}],"total_cents":6}`)
		}, "does not match")
		mallory := newEvent(t)
		mallory.Data = []byte(`{"order_id":"` + uuid.NewString() + `","customer_id":"mallory","lines":[{"sku":"s","quantity":1,"unit_price_cents":5}],"total_cents":5}`)
		publish(mallory, func(*nats.Msg) {}, "customer is blocked")
		publish(newEvent(t), nil, "")
		publish(newEvent(t), nil, "")

		c := e.start(t, inbox.Config{Batched: batched}, h)
		require.Eventually(t, func() bool {
			s := c.Stats()
			return s.Processed == int64(len(valid)) && s.DeadLettered == int64(len(poison))
		}, waitFor, tick)
		require.Zero(t, c.Stats().Retried, "a poison message was retried")
		e.requireSettled(t)

		for _, ev := range valid {
			require.EqualValues(t, 1, e.effects(t, ev.ID))
		}
		n, err := e.count(t.Context(), `SELECT count(*) FROM effects`)
		require.NoError(t, err)
		require.EqualValues(t, len(valid), n, "a rejected event's write was committed")
		require.EqualValues(t, len(valid), e.claims(t))

		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, len(poison))
		s, err := e.js.Stream(t.Context(), testStream)
		require.NoError(t, err)
		for _, d := range dlq {
			seq := parseSeq(t, d.Header.Get(inbox.HeaderDLQStreamSeq))
			want, ok := poison[seq]
			require.True(t, ok, "stream seq %d was dead-lettered but is not poison", seq)
			reason := requireDeadLetter(t, d, seq, 1)
			require.Contains(t, reason, want)
			orig, err := s.GetMsg(t.Context(), seq)
			require.NoError(t, err)
			require.Equal(t, orig.Data, d.Data, "the DLQ copy's body")
			require.Equal(t, orig.Subject, d.Header.Get(inbox.HeaderDLQSubject))
			for k := range orig.Header {
				if !strings.HasPrefix(k, "Nats-") {
					require.Equal(t, orig.Header[k], d.Header[k], "header %s", k)
				}
			}
		}
	})
}

func TestMaxDeliverExhaustionIsDeadLettered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const maxDeliver = 3
		e := setup(t, streams.Consumer{MaxDeliver: maxDeliver})
		var calls atomic.Int32
		c := e.start(t, inbox.Config{Batched: batched}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			calls.Add(1)
			if err := writeEffect(ctx, tx, ev); err != nil {
				return err
			}
			return errors.New("the ledger is locked")
		})
		ev := newEvent(t)
		e.publish(t, ev)

		require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, waitFor, tick)
		require.Equal(t, inbox.Stats{DeadLettered: 1, Retried: maxDeliver - 1}, c.Stats())
		require.EqualValues(t, maxDeliver, calls.Load())
		require.Zero(t, e.effects(t, ev.ID))
		require.Zero(t, e.claims(t))
		e.requireSettled(t)

		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 1)
		reason := requireDeadLetter(t, dlq[0], 1, maxDeliver)
		require.Contains(t, reason, "the ledger is locked")
		require.Equal(t, ev.ID.String(), dlq[0].Header.Get(event.HeaderID))
	})
}

// A failing event comes back later each time: its nak asks for a delay
// that doubles with each delivery. Only lower bounds are asserted, as the
// server never redelivers early; a delay that did not grow would bring the
// last delivery back eight times too soon.
func TestRedeliveriesBackOff(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const base, deliveries = 100 * time.Millisecond, 5
		e := setup(t, streams.Consumer{MaxDeliver: deliveries + 1})
		var (
			mu sync.Mutex
			at []time.Time // of each delivery
		)
		c := e.start(t, inbox.Config{Batched: batched, NakDelay: base}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			if len(at) < deliveries {
				return errors.New("the ledger is locked")
			}
			return writeEffect(ctx, tx, ev)
		})
		ev := newEvent(t)
		e.publish(t, ev)

		require.Eventually(t, func() bool { return c.Stats().Processed == 1 }, waitFor, tick)
		require.Equal(t, inbox.Stats{Processed: 1, Retried: deliveries - 1}, c.Stats())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, at, deliveries)
		for i := 1; i < deliveries; i++ {
			require.GreaterOrEqual(t, at[i].Sub(at[i-1]), base<<(i-1), "the wait before delivery %d", i+1)
		}
	})
}

// A write that fails fails its own event, whatever its place in the
// batch: only the target is retried and dead-lettered.
func TestAFailedWriteFailsItsOwnEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		batched bool
		target  int // which of the three events writes what cannot be written
	}{
		{name: "unbatched", target: 1},
		{name: "batched, in the middle", batched: true, target: 1},
		{name: "batched, the last", batched: true, target: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const maxDeliver = 2
			e := setup(t, streams.Consumer{MaxDeliver: maxDeliver})
			evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
			for _, ev := range evs {
				e.publish(t, ev)
			}
			var calls [3]atomic.Int32
			obs := newObservations()
			c := e.start(t, inbox.Config{Batched: tc.batched, BatchSize: 10, Observer: obs}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				i := slices.IndexFunc(evs, func(e event.Envelope) bool { return e.ID == ev.ID })
				calls[i].Add(1)
				var n int64
				err := tx.QueryRow(ctx, "-- name: CountEffects :one\nSELECT count(*) FROM effects WHERE event_id = $1", ev.ID).Scan(&n)
				if err != nil {
					return err
				}
				if i == tc.target {
					_, err := tx.Exec(ctx, "-- name: WriteNothing :exec\nINSERT INTO effects (event_id, n) VALUES ($1, NULL)", ev.ID)
					return err
				}
				return writeEffect(ctx, tx, ev)
			})

			require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, waitFor, tick)
			require.Equal(t, inbox.Stats{Processed: 2, DeadLettered: 1, Retried: maxDeliver - 1}, c.Stats())
			e.requireSettled(t)
			dlq := e.dlqMsgs(t)
			require.Len(t, dlq, 1)
			require.Equal(t, evs[tc.target].ID.String(), dlq[0].Header.Get(event.HeaderID))
			require.Contains(t, requireDeadLetter(t, dlq[0], uint64(tc.target+1), maxDeliver), "null value in column")
			for i, ev := range evs {
				if i != tc.target {
					require.EqualValues(t, 1, e.effects(t, ev.ID))
				}
			}
			// Batched, the first delivery's batch failed and its events
			// ran again one by one; the redelivery came alone.
			wantCalls, wantRollbacks := maxDeliver, maxDeliver
			if tc.batched {
				wantCalls, wantRollbacks = maxDeliver+1, maxDeliver+1
			}
			require.EqualValues(t, wantCalls, calls[tc.target].Load())

			// The Observer saw the same: the write's failure as its
			// handler's, once per call, and a rollback for each.
			obs.mu.Lock()
			defer obs.mu.Unlock()
			require.Zero(t, obs.open, "handler calls the Observer was not told the end of")
			for i, ev := range evs {
				errs := obs.handled[ev.ID]
				require.Len(t, errs, int(calls[i].Load()), "event %d: one end per handler call", i)
				for _, err := range errs {
					if i == tc.target {
						require.ErrorContains(t, err, "null value in column")
					} else {
						require.NoError(t, err, "event %d did not fail", i)
					}
				}
			}
			require.Equal(t, wantRollbacks, obs.rollbacks, "one rolled-back transaction per failed call")
		})
	}
}

// observations is an inbox.Observer that records the handler calls and
// transactions it is told of.
type observations struct {
	mu        sync.Mutex
	open      int                   // handler calls not ended yet
	handled   map[uuid.UUID][]error // the error of each ended call, by event
	rollbacks int                   // transactions that did not commit
}

func newObservations() *observations {
	return &observations{handled: map[uuid.UUID][]error{}}
}

func (o *observations) Handle(ctx context.Context, ev event.Envelope) (context.Context, func(error)) {
	return ctx, o.start([]event.Envelope{ev})
}

func (o *observations) HandleBatch(ctx context.Context, evs []event.Envelope) (context.Context, func(error)) {
	return ctx, o.start(evs)
}

// start records the start of a call for evs and returns its done: a done
// called twice, or never, shows in open and in handled.
func (o *observations) start(evs []event.Envelope) func(error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.open++
	return func(err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.open--
		for _, ev := range evs {
			o.handled[ev.ID] = append(o.handled[ev.ID], err)
		}
	}
}

func (o *observations) Transaction(_ int, _ time.Duration, err error) {
	if err != nil {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.rollbacks++
	}
}

func (o *observations) Settled(event.Envelope, inbox.Outcome, uint64) {}

func TestEventsBeyondRetentionAreDeadLettered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{})
		var mu sync.Mutex
		handled := map[uuid.UUID]int{}
		c := e.start(t, inbox.Config{Batched: batched, Retention: time.Hour}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			mu.Lock()
			handled[ev.ID]++
			mu.Unlock()
			return writeEffect(ctx, tx, ev)
		})
		// Partitions are dropped by the time in the event id; an event
		// whose own time is old is refused too.
		oldTime := newEvent(t)
		oldTime.Time = time.Now().Add(-2 * time.Hour)
		oldID := newEvent(t)
		oldID.ID = idMintedAt(t, time.Now().Add(-2*time.Hour))
		fresh := newEvent(t)
		e.publish(t, oldTime)
		e.publish(t, oldID)
		e.publish(t, fresh)

		require.Eventually(t, func() bool {
			s := c.Stats()
			return s.Processed == 1 && s.DeadLettered == 2
		}, waitFor, tick)
		mu.Lock()
		require.Equal(t, map[uuid.UUID]int{fresh.ID: 1}, handled, "the handler saw an old event")
		mu.Unlock()
		require.Zero(t, e.effects(t, oldTime.ID))
		require.Zero(t, e.effects(t, oldID.ID))
		e.requireSettled(t)

		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 2)
		for i, old := range []event.Envelope{oldTime, oldID} {
			require.Contains(t, requireDeadLetter(t, dlq[i], uint64(i+1), 1), "retention")
			require.Equal(t, old.ID.String(), dlq[i].Header.Get(event.HeaderID))
		}
	})
}

func TestDatabaseOutageLosesNothing(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const events = 300
		// Enough deliveries to ride out the outages: none may be dead-lettered.
		e := setup(t, streams.Consumer{MaxDeliver: 100})
		c := e.start(t, inbox.Config{Batched: batched, BatchSize: 16, Workers: 2},
			func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				if err := writeEffect(ctx, tx, ev); err != nil {
					return err
				}
				// Slow enough that the outages hit transactions in flight.
				_, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`)
				return err
			})
		for range events {
			e.publish(t, newEvent(t))
		}

		// Cut every connection each time another part of the work is done.
		ctx := t.Context()
		outages := 0
		for _, done := range []int64{events / 5, 2 * events / 5, 3 * events / 5, 4 * events / 5} {
			require.Eventually(t, func() bool { return c.Stats().Processed >= done }, waitFor, time.Millisecond)
			require.NoError(t, e.db.TerminateBackends(ctx))
			outages++
		}

		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := e.count(ctx, `SELECT count(DISTINCT event_id) FROM effects`)
			require.NoError(c, err)
			assert.EqualValues(c, events, n)
		}, waitFor, tick)
		e.requireSettled(t)
		n, err := e.count(ctx, `SELECT count(*) FROM effects`)
		require.NoError(t, err)
		require.EqualValues(t, events, n, "an effect was applied twice")
		require.EqualValues(t, events, e.claims(t))
		// A commit whose reply the outage cut off counts as a failure, and its
		// redelivery as a duplicate.
		s := c.Stats()
		require.Zero(t, s.DeadLettered)
		require.GreaterOrEqual(t, s.Processed+s.Duplicates, int64(events))
		t.Logf("%d outages: %+v", outages, s)
	})
}

func TestGracefulStopFinishesInFlight(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{})
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		c := e.consumer(inbox.Config{Batched: batched}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			once.Do(func() { close(started) })
			<-release
			// Run's context is canceled by now; the handler's is not.
			if err := ctx.Err(); err != nil {
				return err
			}
			return writeEffect(ctx, tx, ev)
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		ev := newEvent(t)
		e.publish(t, ev)
		select {
		case <-started:
		case <-time.After(waitFor):
			t.Fatal("the handler was not called")
		}
		cancel()
		require.Never(t, func() bool { return len(done) > 0 }, 300*time.Millisecond, tick,
			"Run returned while a handler was running")
		close(release)
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(waitFor):
			t.Fatal("Run did not return")
		}

		// Committed and acked before Run returned.
		require.EqualValues(t, 1, e.effects(t, ev.ID))
		require.Equal(t, inbox.Stats{Processed: 1}, c.Stats())
		e.requireSettled(t)
	})
}

func TestRunFailsWithoutTheDurable(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	c := inbox.New(e.db.Pool, e.js, inbox.Config{Stream: testStream, Durable: "missing"}, writeEffect, e.logger)
	err := c.Run(t.Context())
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound)
}

// A durable deleted under a running Consumer ends Run with an error that
// says so, rather than leaving it waiting for messages that cannot come.
func TestRunFailsWhenItsDurableIsDeleted(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	c := e.consumer(inbox.Config{}, writeEffect)
	done := make(chan error, 1)
	go func() { done <- c.Run(t.Context()) }()
	e.publish(t, newEvent(t))
	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, inbox.Stats{Processed: 1}, c.Stats())
	}, waitFor, tick)

	require.NoError(t, e.js.DeleteConsumer(t.Context(), testStream, testDurable))
	select {
	case err := <-done:
		require.ErrorIs(t, err, jetstream.ErrConsumerDeleted)
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
}

// A service stopped while it starts must stop cleanly, not fail.
func TestRunStoppedBeforeItStartsReturnsNil(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	c := inbox.New(e.db.Pool, e.js, inbox.Config{Stream: testStream, Durable: "missing"}, writeEffect, e.logger)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, c.Run(ctx))
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	base := errors.New("no such wallet")
	err := inbox.Permanent(base)
	require.ErrorIs(t, err, inbox.ErrPermanent)
	require.ErrorIs(t, err, base)
	require.NoError(t, inbox.Permanent(nil))
}

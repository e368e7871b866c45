package inbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// writeEffects is the set-based form of writeEffect. Its write goes with
// the inbox's COMMIT.
func writeEffects(ctx context.Context, _ pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	_, err := writes.Exec(ctx, `INSERT INTO effects (event_id, n) SELECT unnest($1::uuid[]), 1`, ids)
	return err
}

// readThenWriteEffects is writeEffects after a read of the batch's effects,
// as a set-based handler reads the rows it will update.
func readThenWriteEffects(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = ANY($1::uuid[])`, ids).Scan(&n); err != nil {
		return err
	}
	return writeEffects(ctx, tx, evs, writes)
}

// batchRecorder is a BatchHandler that records the events of each call.
type batchRecorder struct {
	mu    sync.Mutex
	calls [][]uuid.UUID
	next  inbox.BatchHandler
}

func (r *batchRecorder) handle(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	r.mu.Lock()
	r.calls = append(r.calls, ids)
	r.mu.Unlock()
	return r.next(ctx, tx, evs, writes)
}

// batches is how many calls the handler had.
func (r *batchRecorder) batches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// all is the events of each call, in call order.
func (r *batchRecorder) all() [][]uuid.UUID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func TestBatchHandlerGetsTheNewEventsInFetchOrder(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	ev1, ev2, ev3, old := newEvent(t), newEvent(t), newEvent(t), newEvent(t)
	// old was processed before: its claim is there, its redelivery is a
	// duplicate that only the claim statement can recognise.
	e.processedBefore(t, old)
	for _, ev := range []event.Envelope{ev1, old, ev2, ev1, ev3} {
		e.publish(t, ev)
	}

	var perEvent atomic.Int64
	rec := &batchRecorder{next: writeEffects}
	c := e.start(t, inbox.Config{Batched: true, BatchSize: 10, BatchHandler: rec.handle},
		func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			perEvent.Add(1)
			return writeEffect(ctx, tx, ev)
		})

	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, inbox.Stats{Processed: 3, Duplicates: 2}, c.Stats())
	}, waitFor, tick)
	// The batch of first deliveries was claimed ahead, on the bet that its
	// events were new: it lost, and the batch ran again, claimed asking
	// which were new. A copy of an event in the batch is not claimed twice.
	// The five deliveries are one batch unless the goroutine handing them
	// over was kept from running past jsbatch's burst wait (seen in CI at
	// load 20): then the batches they were cut into must show the same.
	delivered := []uuid.UUID{ev1.ID, old.ID, ev2.ID, ev1.ID, ev3.ID}
	oneBatch := [][]uuid.UUID{{ev1.ID, old.ID, ev2.ID, ev3.ID}, {ev1.ID, ev2.ID, ev3.ID}}
	require.Equal(t, oneBatch, batchCalls(delivered, []uuid.UUID{old.ID}, nil), "the model of the calls")
	calls := rec.all()
	require.True(t, slices.ContainsFunc(allCuts(len(delivered)), func(cuts []int) bool {
		return slices.EqualFunc(calls, batchCalls(delivered, []uuid.UUID{old.ID}, cuts), slices.Equal)
	}), "every event once, then the new ones only, in delivery order: want %v or the same cut into batches, got %v", oneBatch, calls)
	require.Zero(t, perEvent.Load(), "the per-event handler is only the fallback")
	for _, ev := range []event.Envelope{ev1, ev2, ev3} {
		require.EqualValues(t, 1, e.effects(t, ev.ID))
	}
	require.Zero(t, e.effects(t, old.ID))
	require.EqualValues(t, 4, e.claims(t))
	e.requireSettled(t)
}

// batchCalls is what a batch handler is called with when delivered, of
// which processedBefore had been processed, comes in batches cut before the
// indexes cuts: each batch once, claimed ahead, without the copies of an
// event already in it; and, when one of its events had been claimed
// before, again with those that had not, if any.
func batchCalls(delivered, processedBefore []uuid.UUID, cuts []int) [][]uuid.UUID {
	claimed := map[uuid.UUID]bool{}
	for _, id := range processedBefore {
		claimed[id] = true
	}
	var calls [][]uuid.UUID
	bounds := append(append([]int{0}, cuts...), len(delivered))
	for i := range len(bounds) - 1 {
		var batch, fresh []uuid.UUID
		for _, id := range delivered[bounds[i]:bounds[i+1]] {
			if slices.Contains(batch, id) {
				continue
			}
			batch = append(batch, id)
			if !claimed[id] {
				fresh = append(fresh, id)
			}
		}
		calls = append(calls, batch)
		if len(fresh) < len(batch) && len(fresh) > 0 {
			calls = append(calls, fresh)
		}
		for _, id := range fresh {
			claimed[id] = true
		}
	}
	return calls
}

// allCuts is every way to cut n deliveries into batches: the indexes, in
// order, before which a batch begins (none: one batch).
func allCuts(n int) [][]int {
	var all [][]int
	for mask := range 1 << (n - 1) {
		var cuts []int
		for i := 1; i < n; i++ {
			if mask&(1<<(i-1)) != 0 {
				cuts = append(cuts, i)
			}
		}
		all = append(all, cuts)
	}
	return all
}

// A set-based batch's reads are planned for their arguments (a generic
// plan would assume ten elements in an array) and its writes run with their
// generic plans, planned once (PostgreSQL would plan them for each batch's
// arrays); the transaction's end restores the session's plan_cache_mode.
func TestBatchReadsArePlannedPerCallAndWritesGeneric(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := setup(t, streams.Consumer{})
	const events = 12
	for range events {
		e.publish(t, newEvent(t))
	}
	cfg := e.db.Pool.Config()
	cfg.MaxConns = 1 // the session looked at below is the consumer's
	// A session that would run every prepared statement with its generic
	// plan, as PostgreSQL may choose to after five calls.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rec := &batchRecorder{next: readThenWriteEffects}
	c := inbox.New(pool, e.js, inbox.Config{
		Stream: testStream, Durable: testDurable, Batched: true, BatchSize: 3, BatchHandler: rec.handle,
	}, writeEffect, e.logger)
	run(t, c)
	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, inbox.Stats{Processed: events}, c.Stats())
	}, waitFor, tick)

	var mode string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode))
	require.Equal(t, "force_generic_plan", mode)
	plans := func(statement string) (generic, custom int) {
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1`, statement).
			Scan(&generic, &custom))
		return generic, custom
	}
	generic, custom := plans(`SELECT count(*) FROM effects%`)
	require.Zero(t, generic, "the reads' generic plans")
	require.Equal(t, rec.batches(), custom, "one plan per batch for the reads")
	generic, custom = plans(`INSERT INTO effects%`)
	require.Equal(t, rec.batches(), generic, "one generic plan run per batch for the writes")
	require.Zero(t, custom)
}

// What a transaction costs in round trips: the reference path sends each
// statement on its own (BEGIN, the claim, the handler's statements,
// COMMIT); the batch path sends BEGIN and the claim of a batch of first
// deliveries with the handlers' first statement, and a set-based
// handler's writes with the COMMIT.
func TestRoundTripsOfATransaction(t *testing.T) {
	t.Parallel()
	readThenWrite := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID).Scan(&n); err != nil {
			return err
		}
		return writeEffect(ctx, tx, ev)
	}
	const events = 3
	for _, tc := range []struct {
		name    string
		cfg     inbox.Config
		handler inbox.Handler
		trips   int64
	}{
		{"unbatched, a write", inbox.Config{}, writeEffect, 4 * events},
		{"unbatched, a read and a write", inbox.Config{}, readThenWrite, 5 * events},
		{"batched, a write each", inbox.Config{Batched: true}, writeEffect, events + 1},
		{"batched, a read and a write each", inbox.Config{Batched: true}, readThenWrite, 2*events + 1},
		{"set-based, a read and a write", inbox.Config{Batched: true, BatchHandler: readThenWriteEffects}, writeEffect, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, streams.Consumer{})
			for range events {
				e.publish(t, newEvent(t))
			}
			pool, trips := e.db.CountingPool(t)
			cfg := tc.cfg
			cfg.Stream, cfg.Durable, cfg.BatchSize = testStream, testDurable, 10
			c := inbox.New(pool, e.js, cfg, tc.handler, e.logger)
			run(t, c)
			require.EventuallyWithT(t, func(c2 *assert.CollectT) {
				assert.Equal(c2, inbox.Stats{Processed: events}, c.Stats())
			}, waitFor, tick)
			require.Equal(t, tc.trips, trips.Load())
			require.EqualValues(t, events, e.claims(t))
			effects, err := e.count(t.Context(), `SELECT count(*) FROM effects`)
			require.NoError(t, err)
			require.EqualValues(t, events, effects)
		})
	}
}

// marker is what the batch handler writes for each event of evs: 2 when
// the batch holds the bad event (a write that must be rolled back), 1
// when the batch came without it (so was not to fail).
func marker(evs []event.Envelope, bad event.Envelope) int {
	if slices.ContainsFunc(evs, func(ev event.Envelope) bool { return ev.ID == bad.ID }) {
		return 2
	}
	return 1
}

func TestBatchHandlerFailureFallsBackEventByEvent(t *testing.T) {
	t.Parallel()
	// The batch handler writes for every event before the bad one fails the
	// batch; none of that may survive the fallback.
	for _, tc := range []struct {
		name  string
		batch func(bad event.Envelope) inbox.BatchHandler
		err   string // the batch's failure
	}{
		{
			name: "the handler fails",
			err:  "bad event in the batch",
			batch: func(bad event.Envelope) inbox.BatchHandler {
				return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
					for _, ev := range evs {
						if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id, n) VALUES ($1, $2)`, ev.ID, marker(evs, bad)); err != nil {
							return err
						}
					}
					for _, ev := range evs {
						if ev.ID == bad.ID {
							return inbox.Permanent(errors.New("bad event in the batch"))
						}
					}
					return nil
				}
			},
		},
		{
			name: "a write queued for the commit fails",
			err:  "division by zero",
			batch: func(bad event.Envelope) inbox.BatchHandler {
				return func(ctx context.Context, _ pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
					for _, ev := range evs {
						if _, err := writes.Exec(ctx, `INSERT INTO effects (event_id, n) VALUES ($1, $2)`, ev.ID, marker(evs, bad)); err != nil {
							return err
						}
						if ev.ID == bad.ID {
							if _, err := writes.Exec(ctx, `SELECT 1 / 0`); err != nil {
								return err
							}
						}
					}
					return nil
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, streams.Consumer{})
			good1, bad, good2 := newEvent(t), newEvent(t), newEvent(t)
			for _, ev := range []event.Envelope{good1, bad, good2} {
				e.publish(t, ev)
			}
			handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				if ev.ID == bad.ID {
					return inbox.Permanent(errors.New("bad event"))
				}
				return writeEffect(ctx, tx, ev)
			}
			obs := newObservations()
			c := e.start(t, inbox.Config{Batched: true, BatchSize: 10, BatchHandler: tc.batch(bad), Observer: obs}, handler)

			require.EventuallyWithT(t, func(c2 *assert.CollectT) {
				assert.Equal(c2, inbox.Stats{Processed: 2, DeadLettered: 1}, c.Stats())
			}, waitFor, tick)
			for _, ev := range []event.Envelope{good1, good2} {
				require.EqualValues(t, 1, e.effects(t, ev.ID))
			}
			require.Zero(t, e.effects(t, bad.ID))
			n, err := e.count(t.Context(), `SELECT count(*) FROM effects WHERE n <> 1`)
			require.NoError(t, err)
			require.Zero(t, n, "the failed batch handler's writes are rolled back")
			require.EqualValues(t, 2, e.claims(t), "the bad event's claim is released, the others' kept")
			require.Len(t, e.dlqMsgs(t), 1)
			e.requireSettled(t)

			// The Observer was told of the batch's failure, then of the
			// bad event's own, each in a transaction rolled back.
			obs.mu.Lock()
			defer obs.mu.Unlock()
			require.Zero(t, obs.open, "handler calls the Observer was not told the end of")
			errs := obs.handled[bad.ID]
			require.Len(t, errs, 2, "the batch handler's call and the handler's")
			require.ErrorContains(t, errs[0], tc.err)
			require.ErrorContains(t, errs[1], "bad event")
			require.Equal(t, 2, obs.rollbacks)
		})
	}
}

func TestBatchHandlerDuplicatesRacingHaveOneEffect(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	var cs []*inbox.Consumer
	for range 2 {
		cs = append(cs, e.start(t, inbox.Config{Batched: true, BatchSize: 4, Workers: 2, BatchHandler: writeEffects}, writeEffect))
	}
	evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
	const copies = 20
	for range copies {
		for _, ev := range evs {
			e.publish(t, ev)
		}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var total inbox.Stats
		for _, cons := range cs {
			s := cons.Stats()
			total.Processed += s.Processed
			total.Duplicates += s.Duplicates
		}
		assert.EqualValues(c, copies*len(evs), total.Processed+total.Duplicates)
		assert.EqualValues(c, len(evs), total.Processed)
	}, waitFor, tick)
	for _, ev := range evs {
		require.EqualValues(t, 1, e.effects(t, ev.ID))
	}
	require.EqualValues(t, len(evs), e.claims(t))
	e.requireSettled(t)
}

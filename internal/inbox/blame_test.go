package inbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// mode is one way a Consumer processes its messages.
type mode struct {
	name string
	cfg  inbox.Config
}

// eachMode runs f as parallel subtests, one per mode: unbatched, batched
// with the per-event handler, and batched with batch as the set-based
// handler (nil: no set-based mode).
func eachMode(t *testing.T, batch inbox.BatchHandler, f func(t *testing.T, cfg inbox.Config)) {
	modes := []mode{
		{"unbatched", inbox.Config{BatchSize: 10}},
		{"batched", inbox.Config{Batched: true, BatchSize: 10}},
	}
	if batch != nil {
		modes = append(modes, mode{"set-based", inbox.Config{Batched: true, BatchSize: 10, BatchHandler: batch}})
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m.cfg)
		})
	}
}

// A statement that fails before it reaches the server (pgx cannot encode
// its argument, or the server cannot prepare it) fails its own event only:
// never the event whose write was queued before it, never the whole batch.
func TestAStatementThatCannotBeSentFailsOnlyItsEvent(t *testing.T) {
	t.Parallel()
	for _, fault := range []struct {
		name string
		sql  string
		arg  any
		want string // in the dead letter's reason
	}{
		{"an argument pgx cannot encode", "SELECT $1::int4", int64(1) << 40, "greater than maximum value for int4"},
		{"a statement the server cannot prepare", "SELECT no_such_column FROM effects WHERE $1::int4 = 1", int32(1), "no_such_column"},
	} {
		t.Run(fault.name, func(t *testing.T) {
			t.Parallel()
			var bad sync.Map // event id → true for the event whose read is bad
			read := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				sql, arg := "SELECT $1::int4", any(int32(1))
				if _, ok := bad.Load(ev.ID); ok {
					sql, arg = fault.sql, fault.arg
				}
				var n int32
				return tx.QueryRow(ctx, sql, arg).Scan(&n)
			}
			handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				if err := read(ctx, tx, ev); err != nil {
					return err
				}
				return writeEffect(ctx, tx, ev)
			}
			// The set-based form reads for each event, then queues the writes.
			batch := func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
				for _, ev := range evs {
					if err := read(ctx, tx, ev); err != nil {
						return err
					}
				}
				return writeEffects(ctx, tx, evs, writes)
			}
			// The bad event first (its read carries BEGIN and a batch's
			// claim) or in the middle (its read follows another's write).
			for _, target := range []int{0, 1} {
				eachMode(t, batch, func(t *testing.T, cfg inbox.Config) {
					e := setup(t, streams.Consumer{MaxDeliver: 1})
					evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
					bad.Store(evs[target].ID, true)
					for _, ev := range evs { // published before the consumer starts: one batch
						e.publish(t, ev)
					}
					c := e.start(t, cfg, handler)

					require.EventuallyWithT(t, func(c2 *assert.CollectT) {
						assert.Equal(c2, inbox.Stats{Processed: 2, DeadLettered: 1}, c.Stats())
					}, waitFor, tick)
					e.requireSettled(t)
					for i, ev := range evs {
						want := 1 // the good events' effect, once
						if i == target {
							want = 0
						}
						require.EqualValues(t, want, e.effects(t, ev.ID), "event %d", i)
					}
					dlq := e.dlqMsgs(t)
					require.Len(t, dlq, 1, "only the bad event is dead-lettered")
					require.Equal(t, evs[target].ID.String(), dlq[0].Header.Get(event.HeaderID))
					require.Contains(t, requireDeadLetter(t, dlq[0], uint64(target+1), 1), fault.want)
					require.Equal(t, inbox.Stats{Processed: 2, DeadLettered: 1}, c.Stats(), "nothing else happened")
				})
			}
		})
	}
}

// Rows read to the end are done, as pgx promises, whether or not the
// handler calls Close: the connection is free for its next statement.
func TestRowsReadToTheEndFreeTheConnection(t *testing.T) {
	t.Parallel()
	readAll := func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 3) AS g")
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != 3 {
			return inbox.Permanent(errors.New("the rows were not all read"))
		}
		return nil // no rows.Close(): Next returning false closed them
	}
	handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if err := readAll(ctx, tx); err != nil {
			return err
		}
		return writeEffect(ctx, tx, ev)
	}
	batch := func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
		if err := readAll(ctx, tx); err != nil {
			return err
		}
		ids := make([]uuid.UUID, len(evs))
		for i, ev := range evs {
			ids[i] = ev.ID
		}
		// A statement sent at once, not queued: it needs the connection.
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, n) SELECT unnest($1::uuid[]), 1`, ids)
		return err
	}
	eachMode(t, batch, func(t *testing.T, cfg inbox.Config) {
		e := setup(t, streams.Consumer{})
		evs := []event.Envelope{newEvent(t), newEvent(t), newEvent(t)}
		for _, ev := range evs {
			e.publish(t, ev)
		}
		c := e.start(t, cfg, handler)
		require.EventuallyWithT(t, func(c2 *assert.CollectT) {
			assert.Equal(c2, inbox.Stats{Processed: 3}, c.Stats())
		}, waitFor, tick)
		e.requireSettled(t)
		for _, ev := range evs {
			require.EqualValues(t, 1, e.effects(t, ev.ID))
		}
		require.Equal(t, inbox.Stats{Processed: 3}, c.Stats(), "nothing was retried")
	})
}

// installClaimFault makes every claim of the test database fail, while
// on, with a database error (not a conflict), as a full disk or a broken
// trigger would.
func (e *env) installClaimFault(t *testing.T) (set func(on bool)) {
	t.Helper()
	ctx := t.Context()
	_, err := e.db.Pool.Exec(ctx, `
CREATE TABLE claim_fault (on_ boolean NOT NULL);
INSERT INTO claim_fault VALUES (false);
CREATE FUNCTION fail_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT on_ FROM claim_fault) THEN
        RAISE EXCEPTION 'injected claim failure';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_claim BEFORE INSERT ON processed_events FOR EACH ROW EXECUTE FUNCTION fail_claim();`)
	require.NoError(t, err)
	return func(on bool) {
		_, err := e.db.Pool.Exec(context.WithoutCancel(ctx), `UPDATE claim_fault SET on_ = $1`, on)
		require.NoError(t, err)
	}
}

// A claim that fails is not an answer: the message is retried, never acked
// as a duplicate, and its effect happens once the fault is lifted.
func TestAClaimThatFailsIsRetriedNotTakenForADuplicate(t *testing.T) {
	t.Parallel()
	eachMode(t, nil, func(t *testing.T, cfg inbox.Config) {
		e := setup(t, streams.Consumer{})
		setFault := e.installClaimFault(t)
		target, other := newEvent(t), newEvent(t)
		var calls atomic.Int32
		c := e.start(t, cfg, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if ev.ID == target.ID && calls.Add(1) == 1 {
				// The first attempt fails, and the claims of its
				// redelivery (and of any other event) fail from now on.
				setFault(true)
				return errors.New("transient failure")
			}
			return writeEffect(ctx, tx, ev)
		})
		e.publish(t, target)
		require.Eventually(t, func() bool { return calls.Load() == 1 }, waitFor, tick)
		e.publish(t, other) // a first delivery, possibly in the redelivery's batch

		// The redelivery's claim fails, again and again: retried each time.
		require.Eventually(t, func() bool { return c.Stats().Retried >= 3 }, waitFor, tick)
		s := c.Stats()
		require.Zero(t, s.Duplicates, "a failed claim was taken for a duplicate")
		require.Zero(t, s.Processed)
		require.EqualValues(t, 1, calls.Load(), "the handler ran though its claim failed")

		setFault(false)
		require.EventuallyWithT(t, func(c2 *assert.CollectT) {
			assert.EqualValues(c2, 2, c.Stats().Processed)
		}, waitFor, tick)
		e.requireSettled(t)
		require.Zero(t, c.Stats().Duplicates)
		require.Zero(t, c.Stats().DeadLettered)
		require.EqualValues(t, 1, e.effects(t, target.ID))
		require.EqualValues(t, 1, e.effects(t, other.ID))
	})
}

// The retention guard refuses what the partition maintenance may already
// have dropped, and it has its own margin: an event older than the
// retention but not yet past the maintenance's cut-off (retention plus a
// margin) is dead-lettered too.
func TestEventsBetweenTheRetentionAndTheMaintenancesCutOffAreDeadLettered(t *testing.T) {
	t.Parallel()
	eachMode(t, writeEffects, func(t *testing.T, cfg inbox.Config) {
		e := setup(t, streams.Consumer{})
		var mu sync.Mutex
		var handled []uuid.UUID
		record := func(evs ...event.Envelope) {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range evs {
				handled = append(handled, ev.ID)
			}
		}
		if cfg.BatchHandler != nil {
			cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
				record(evs...)
				return writeEffects(ctx, tx, evs, writes)
			}
		}
		cfg.Retention = time.Hour
		c := e.start(t, cfg, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			record(ev)
			return writeEffect(ctx, tx, ev)
		})
		old := newEvent(t)
		old.ID = idMintedAt(t, time.Now().Add(-90*time.Minute))
		fresh := newEvent(t)
		e.publish(t, old)
		e.publish(t, fresh)

		require.EventuallyWithT(t, func(c2 *assert.CollectT) {
			assert.Equal(c2, inbox.Stats{Processed: 1, DeadLettered: 1}, c.Stats())
		}, waitFor, tick)
		e.requireSettled(t)
		mu.Lock()
		require.False(t, slices.Contains(handled, old.ID), "the handler saw the old event")
		mu.Unlock()
		require.Zero(t, e.effects(t, old.ID))
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 1)
		require.Equal(t, old.ID.String(), dlq[0].Header.Get(event.HeaderID))
		require.Contains(t, requireDeadLetter(t, dlq[0], 1, 1), "retention")
	})
}

// An operator may force a replay past the retention (onceflow dlq replay
// --past-retention): on the consumer's own replay subject, with the
// header, the old event is processed; without either it is refused.
func TestAReplayForcedPastTheRetentionIsProcessed(t *testing.T) {
	t.Parallel()
	e := setup(t, streams.Consumer{})
	c := e.start(t, inbox.Config{Retention: time.Hour}, writeEffect)
	old := func(subject string, forced bool) event.Envelope {
		ev := newEvent(t)
		ev.ID = idMintedAt(t, time.Now().Add(-90*time.Minute))
		msg := msgOf(t, ev, uuid.NewString())
		msg.Subject = subject
		if forced {
			msg.Header.Set(inbox.HeaderReplayPastRetention, "true")
		}
		e.publishMsg(t, msg)
		return ev
	}
	const subject = "orders.placed.v1"
	forced := old(streams.ReplaySubject(subject, testDurable), true)
	unforced := old(streams.ReplaySubject(subject, testDurable), false)
	elsewhere := old(streams.ReplaySubject(subject, "another-durable"), true)
	plain := old(subject, true)

	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, inbox.Stats{Processed: 1, DeadLettered: 3}, c.Stats())
	}, waitFor, tick)
	require.EqualValues(t, 1, e.effects(t, forced.ID))
	for _, ev := range []event.Envelope{unforced, elsewhere, plain} {
		require.Zero(t, e.effects(t, ev.ID))
	}
}

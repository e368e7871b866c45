package outbox_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// emitter is a consumer's handler that writes an effect and emits the event
// it causes, and then fails for the events it is told to: for good (a
// permanent error) or on their first delivery only.
type emitter struct {
	poison, flaky uuid.UUID

	mu       sync.Mutex
	attempts map[uuid.UUID]int
}

// outcome is what the handler does with ev after its writes: fail or not.
func (e *emitter) outcome(ev event.Envelope) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.attempts[ev.ID]++
	switch {
	case ev.ID == e.poison:
		return inbox.Permanent(errors.New("poison"))
	case ev.ID == e.flaky && e.attempts[ev.ID] == 1:
		return errors.New("flaky")
	}
	return nil
}

func (e *emitter) handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.ID); err != nil {
		return err
	}
	caused, err := ev.Caused("test", event.PaymentDebited, payload{Seq: 1})
	if err != nil {
		return err
	}
	if err := outbox.Enqueue(ctx, tx, caused); err != nil {
		return err
	}
	return e.outcome(ev)
}

// handleBatch is handle's set-based form: its writes queued for the
// COMMIT, the batch failed when one of its events fails.
func (e *emitter) handleBatch(ctx context.Context, _ pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	var caused []event.Envelope
	var failed error
	for _, ev := range evs {
		if _, err := writes.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.ID); err != nil {
			return err
		}
		c, err := ev.Caused("test", event.PaymentDebited, payload{Seq: 1})
		if err != nil {
			return err
		}
		caused = append(caused, c)
		failed = cmp.Or(failed, e.outcome(ev))
	}
	if err := outbox.QueueBatch(ctx, writes, caused); err != nil {
		return err
	}
	return failed
}

// A handler that emits an event and then fails leaves no outbox row: the
// event's writes and its outbox insert roll back together, in every
// consumer mode and whatever the size of the consumer's pool. A batch of a
// good event, one that fails for good and one that fails once shares a
// transaction: the good and the once-failed event emit once each, the
// failed one never.
func TestHandlerThatEmitsAndFailsLeavesNoOutboxRow(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name     string
		batched  bool
		setBased bool
	}{{"unbatched", false, false}, {"batched per event", true, false}, {"set-based", true, true}}
	for _, conns := range []int32{1, 4} {
		for _, m := range modes {
			t.Run(fmt.Sprintf("%s, pool of %d", m.name, conns), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				f := setup(t)
				f.provision(t, 0)
				_, err := f.db.Pool.Exec(ctx, `CREATE TABLE effects (event_id uuid NOT NULL)`)
				require.NoError(t, err)
				pool, err := postgres.Connect(ctx, f.db.URL, func(pc *pgxpool.Config) { pc.MaxConns = conns })
				require.NoError(t, err)
				t.Cleanup(pool.Close)

				good, poison, flaky := newEvent(t, event.OrderPlaced, "good", 1), newEvent(t, event.OrderPlaced, "poison", 1), newEvent(t, event.OrderPlaced, "flaky", 1)
				h := &emitter{poison: poison.ID, flaky: flaky.ID, attempts: map[uuid.UUID]int{}}
				cfg := inbox.Config{Stream: streams.Orders, Durable: streams.PaymentOrders, Batched: m.batched, NakDelay: 50 * time.Millisecond}
				if m.setBased {
					cfg.BatchHandler = h.handleBatch
				}
				consumer := inbox.New(pool, f.js, cfg, h.handle, f.logger)
				for _, ev := range []event.Envelope{good, poison, flaky} {
					msg, err := ev.Msg()
					require.NoError(t, err)
					_, err = f.js.PublishMsgAsync(msg)
					require.NoError(t, err)
				}
				<-f.js.PublishAsyncComplete()
				run(t, consumer)

				require.Eventually(t, func() bool {
					s := consumer.Stats()
					return s.Processed+s.Duplicates+s.DeadLettered >= 3
				}, 20*time.Second, 10*time.Millisecond, "every event settled")
				for _, tt := range []struct {
					ev   event.Envelope
					want int
				}{{good, 1}, {flaky, 1}, {poison, 0}} {
					var effects, emitted int
					require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = $1`, tt.ev.ID).Scan(&effects))
					require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE subject = $1`, tt.ev.Subject).Scan(&emitted))
					require.Equal(t, tt.want, effects, "effects of %s", tt.ev.Subject)
					require.Equal(t, tt.want, emitted, "events emitted by %s", tt.ev.Subject)
				}
				require.Equal(t, inbox.Stats{Processed: 2, DeadLettered: 1, Retried: consumer.Stats().Retried}, consumer.Stats())
			})
		}
	}
}

package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// A handler that panics fails its own message, on every path: the message
// is retried with a backoff and dead-lettered with the panic as its reason
// once its deliveries are spent; its batch-mates' effects happen once; and
// the consumer (and the process) keeps running.
func TestAPanickingHandlerFailsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		batched  bool
		setBased bool
	}{
		{name: "reference"},
		{name: "batched", batched: true},
		{name: "set-based", batched: true, setBased: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const maxDeliver = 3
			e := setup(t, streams.Consumer{MaxDeliver: maxDeliver})
			good1, bad, good2 := newEvent(t), newEvent(t), newEvent(t)
			var nilMap map[string]int // the bug a copied handler has
			handler := func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
				if err := writeEffect(ctx, tx, ev); err != nil {
					return err
				}
				if ev.ID == bad.ID {
					nilMap[ev.Subject]++
				}
				return nil
			}
			cfg := inbox.Config{Batched: tc.batched, BatchSize: 10}
			if tc.setBased {
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
					for _, ev := range evs {
						if err := handler(ctx, tx, ev); err != nil {
							return err
						}
					}
					return nil
				}
			}
			for _, ev := range []event.Envelope{good1, bad, good2} {
				e.publish(t, ev)
			}
			c := e.start(t, cfg, handler)

			requireOnlyItsMessageFailed(t, e, c, maxDeliver, bad, "panic: assignment to entry in nil map", good1, good2)
		})
	}
}

// A decoder that panics fails its own message as a panicking handler does:
// the panic is taken for a fault of the decoder's, not the message's, so
// the message is retried with a backoff and dead-lettered with the panic as
// its reason once its deliveries are spent, while its batch-mates are
// processed and the consumer keeps running.
func TestAPanickingDecoderFailsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		batched bool
	}{
		{name: "reference"},
		{name: "batched", batched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const maxDeliver = 3
			e := setup(t, streams.Consumer{MaxDeliver: maxDeliver})
			good1, bad, good2 := newEvent(t), newEvent(t), newEvent(t)
			for _, ev := range []event.Envelope{good1, bad, good2} {
				e.publish(t, ev)
			}
			c := e.consumer(inbox.Config{Batched: tc.batched, BatchSize: 10}, writeEffect)
			c.SetDecoder(func(h nats.Header, data []byte) (event.Envelope, error) {
				ev, err := event.FromMsg(h, data)
				if err == nil && ev.ID == bad.ID {
					var fields []string
					_ = fields[len(data)] // the bug: an index out of range
				}
				return ev, err
			})
			run(t, c)

			requireOnlyItsMessageFailed(t, e, c, maxDeliver, bad, "panic: runtime error: index out of range", good1, good2)
		})
	}
}

// requireOnlyItsMessageFailed waits until bad was retried and then
// dead-lettered with a reason that holds want, and requires its batch-mates
// good processed once, bad's writes rolled back, and c still consuming.
func requireOnlyItsMessageFailed(t *testing.T, e *env, c *inbox.Consumer, maxDeliver int,
	bad event.Envelope, want string, good ...event.Envelope) {
	t.Helper()
	require.EventuallyWithT(t, func(c2 *assert.CollectT) {
		assert.Equal(c2, inbox.Stats{Processed: int64(len(good)), DeadLettered: 1, Retried: int64(maxDeliver - 1)}, c.Stats())
	}, waitFor, tick)
	for _, ev := range good {
		require.EqualValues(t, 1, e.effects(t, ev.ID), "a batch-mate's effect, once")
	}
	require.Zero(t, e.effects(t, bad.ID), "the failed message's writes are rolled back")
	dlq := e.dlqMsgs(t)
	require.Len(t, dlq, 1)
	reason := requireDeadLetter(t, dlq[0], 2, maxDeliver)
	require.Contains(t, reason, want)
	require.Equal(t, bad.ID.String(), dlq[0].Header.Get(event.HeaderID))

	// Still consuming.
	after := newEvent(t)
	e.publish(t, after)
	require.Eventually(t, func() bool { return e.effects(t, after.ID) == 1 }, waitFor, tick)
	e.requireSettled(t)
}

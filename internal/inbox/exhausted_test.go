package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// A message whose deliveries all end unsettled — the process died in each —
// is not lost in silence when JetStream gives up on it: the consumer hears
// the server's max deliveries advisory and dead-letters it from its stream.
func TestAMessageThatRunsOutOfDeliveriesUnsettledIsDeadLettered(t *testing.T) {
	t.Parallel()
	const maxDeliver = 2
	e := setup(t, streams.Consumer{MaxDeliver: maxDeliver, AckWait: 300 * time.Millisecond})
	bad, good := newEvent(t), newEvent(t)
	c := e.consumer(inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		if ev.ID == bad.ID {
			return errors.New("the process dies here")
		}
		return writeEffect(ctx, tx, ev)
	})
	c.SetSkipSettle(func(ev event.Envelope) bool { return ev.ID == bad.ID })
	run(t, c)
	e.publish(t, bad)
	e.publish(t, good)

	require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, waitFor, tick)
	dlq := e.dlqMsgs(t)
	require.Len(t, dlq, 1)
	reason := requireDeadLetter(t, dlq[0], 1, maxDeliver)
	require.Contains(t, reason, "MaxDeliver")
	require.Equal(t, bad.ID.String(), dlq[0].Header.Get(event.HeaderID))
	require.EqualValues(t, 1, e.effects(t, good.ID))
	e.requireSettled(t)
}

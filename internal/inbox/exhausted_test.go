package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// dying is a handler in a process that dies in it: it fails, and its
// consumer leaves the message unsettled (skip), for a given number of
// deliveries; after those it would succeed, so that a handler run past the
// budget shows as an effect.
type dying struct {
	left atomic.Int64 // the deliveries still to die in
}

func newDying(deliveries int) *dying {
	d := &dying{}
	d.left.Store(int64(deliveries))
	return d
}

func (d *dying) handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if d.left.Load() > 0 {
		return errors.New("the process dies here")
	}
	return writeEffect(ctx, tx, ev)
}

// skip is the consumer's SetSkipSettle: every message is left unsettled.
func (d *dying) skip(event.Envelope) bool {
	d.left.Add(-1)
	return true
}

// A message whose deliveries all end unsettled — the process died in each —
// is not lost in silence: the delivery after the budget runs no handler
// and dead-letters it.
func TestAMessageThatRunsOutOfDeliveriesUnsettledIsDeadLettered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const maxDeliver = 2
		e := setup(t, streams.Consumer{MaxDeliver: maxDeliver, AckWait: 300 * time.Millisecond})
		bad, good := newEvent(t), newEvent(t)
		d := newDying(maxDeliver)
		c := e.consumer(inbox.Config{Batched: batched}, func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if ev.ID == bad.ID {
				return d.handle(ctx, tx, ev)
			}
			return writeEffect(ctx, tx, ev)
		})
		c.SetSkipSettle(func(ev event.Envelope) bool { return ev.ID == bad.ID && d.skip(ev) })
		run(t, c)
		e.publish(t, bad)
		e.publish(t, good)

		require.Eventually(t, func() bool { return c.Stats().DeadLettered == 1 }, waitFor, tick)
		e.requireSettled(t)
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 1)
		reason := requireDeadLetter(t, dlq[0], 1, maxDeliver+1)
		require.Contains(t, reason, "past the budget of 2")
		require.Equal(t, bad.ID.String(), dlq[0].Header.Get(event.HeaderID))
		require.Zero(t, e.effects(t, bad.ID), "the delivery past the budget runs no handler")
		require.EqualValues(t, 1, e.effects(t, good.ID))
	})
}

// The last delivery that runs the handler dies with its process, and no
// replica runs until its ack wait is over, by the server's clock. The
// server still holds the message — it never gives up on one — and the next
// consumer to start dead-letters it, once, without running its handler.
// (With the server counting deliveries, it dropped the message when the ack
// wait ended and told only the subscribers of its advisory at that moment:
// none. nats-server 2.15 does so at the ack wait's end for a MaxDeliver of
// 1, and for a larger one at the next pull: hence a budget of 1 here.)
func TestAMessageExhaustedWhileEveryReplicaIsDownIsDeadLettered(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const maxDeliver, ackWait = 1, 300 * time.Millisecond
		e := setup(t, streams.Consumer{MaxDeliver: maxDeliver, AckWait: ackWait})
		ev := newEvent(t)
		d := newDying(maxDeliver)
		a := e.consumer(inbox.Config{Batched: batched}, d.handle)
		a.SetSkipSettle(d.skip)
		stopA := runStoppable(t, a)
		e.publish(t, ev)
		require.Eventually(t, func() bool { return d.left.Load() == 0 }, waitFor, tick, "the budget's deliveries die")
		lastDied := time.Now()
		stopA() // every replica is down, the last delivery unsettled

		cons, err := e.js.Consumer(t.Context(), testStream, testDurable)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			info, err := cons.Info(t.Context())
			return err == nil && info.TimeStamp.After(lastDied.Add(ackWait+time.Second))
		}, waitFor, tick, "the last delivery's ack wait ends while no consumer runs")
		info, err := cons.Info(t.Context())
		require.NoError(t, err)
		require.EqualValues(t, 1, info.NumAckPending, "the server keeps the message for the inbox")

		b := e.start(t, inbox.Config{Batched: batched}, writeEffect)
		require.Eventually(t, func() bool { return b.Stats().DeadLettered == 1 }, waitFor, tick)
		e.requireSettled(t)
		require.Equal(t, inbox.Stats{DeadLettered: 1}, b.Stats())
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 1)
		requireDeadLetter(t, dlq[0], 1, maxDeliver+1)
		require.Equal(t, ev.ID.String(), dlq[0].Header.Get(event.HeaderID))
		require.Zero(t, e.effects(t, ev.ID), "past the budget, no handler runs")
		require.Zero(t, e.claims(t))
	})
}

// An event whose last delivery of the budget committed but whose ack was
// lost is not dead-lettered on the delivery after: the claim finds it
// processed, and it is acked as a duplicate.
func TestAnEventProcessedOnItsLastDeliveryIsNotDeadLetteredAfter(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{MaxDeliver: 1, AckWait: 300 * time.Millisecond})
		ev := newEvent(t)
		c := e.consumer(inbox.Config{Batched: batched}, writeEffect)
		c.SetSkipAck(func(event.Envelope) bool { return true })
		run(t, c)
		e.publish(t, ev)

		require.Eventually(t, func() bool { return c.Stats().Duplicates >= 1 }, waitFor, tick)
		e.requireSettled(t)
		// Under load the duplicate can wait in hand past the 300 ms ack
		// wait and come once more: a second duplicate, never a dead letter
		// (as in TestFourHundredMessagesExhaustedAtOnceAreEachDeadLetteredOnce).
		stats := c.Stats()
		require.NotZero(t, stats.Duplicates)
		stats.Duplicates = 0
		require.Equal(t, inbox.Stats{Processed: 1}, stats)
		require.Empty(t, e.dlqMsgs(t))
		require.EqualValues(t, 1, e.effects(t, ev.ID))
	})
}

// Four hundred messages run out of their budget at once, each in a
// process that died in it: each is dead-lettered exactly once. (With the
// server's advisories read through a 64-slot channel, the client dropped
// most of the burst as a slow consumer.)
func TestFourHundredMessagesExhaustedAtOnceAreEachDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		const n = 400
		e := setup(t, streams.Consumer{MaxDeliver: 1, AckWait: 5 * time.Second})
		for range n {
			e.publish(t, newEvent(t))
		}
		d := newDying(n)
		c := e.consumer(inbox.Config{Batched: batched}, d.handle)
		c.SetSkipSettle(d.skip)
		run(t, c)

		require.Eventually(t, func() bool { return c.Stats().DeadLettered >= n }, waitFor, tick)
		e.requireSettled(t)
		// Under load a delivery can wait in hand past its ack wait and come
		// again: its second dead-letter is a duplicate, not a second entry
		// (TestAMessageDeliveredAgainAfterItsDeadLetterIsADuplicate).
		stats := c.Stats()
		stats.Duplicates = 0
		require.Equal(t, inbox.Stats{DeadLettered: n}, stats)
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, n)
		seen := make(map[uint64]bool, n)
		for _, m := range dlq {
			seq := parseSeq(t, m.Header.Get(inbox.HeaderDLQStreamSeq))
			requireDeadLetter(t, m, seq, 2)
			require.False(t, seen[seq], "stream seq %d dead-lettered twice", seq)
			seen[seq] = true
		}
		for seq := uint64(1); seq <= n; seq++ {
			require.True(t, seen[seq], "stream seq %d not dead-lettered", seq)
		}
		effects, err := e.count(t.Context(), `SELECT count(*) FROM effects`)
		require.NoError(t, err)
		require.Zero(t, effects, "past the budget, no handler runs")
		require.Zero(t, e.claims(t))
	})
}

// A message is dead-lettered once however often it is delivered: a
// delivery that comes after another already copied it to the DLQ — its
// term was lost, its process died before the term, or the server
// redelivered it while it waited in hand past its ack wait, as 3 of 400
// did under load in TestFourHundredMessagesExhaustedAtOnceAreEachDeadLetteredOnce —
// is terminated as a duplicate, not counted dead-lettered again.
func TestAMessageDeliveredAgainAfterItsDeadLetterIsADuplicate(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, batched bool) {
		e := setup(t, streams.Consumer{AckWait: 300 * time.Millisecond})
		ev := newEvent(t)
		c := e.consumer(inbox.Config{Batched: batched}, func(context.Context, pgx.Tx, event.Envelope) error {
			return inbox.Permanent(errors.New("bad event"))
		})
		var lost atomic.Bool
		c.SetSkipTerm(func(event.Envelope) bool { return lost.CompareAndSwap(false, true) })
		run(t, c)
		e.publish(t, ev)

		require.Eventually(t, func() bool { s := c.Stats(); return s.DeadLettered+s.Duplicates == 2 }, waitFor, tick,
			"the delivery after the lost term is settled")
		e.requireSettled(t)
		require.Equal(t, inbox.Stats{DeadLettered: 1, Duplicates: 1}, c.Stats(), "dead-lettered once, then a duplicate")
		dlq := e.dlqMsgs(t)
		require.Len(t, dlq, 1)
		requireDeadLetter(t, dlq[0], 1, 1)
	})
}

package conformance

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/postgres"
)

// modeProperties are the properties checked in each mode the subscription
// runs in (the reference path, batched, set-based): how the inbox groups
// the events must not change what the handler's effect is.
var modeProperties = []property{
	{"duplicate-in-sequence", duplicateInSequence},
	{"duplicate-concurrent", duplicateConcurrent},
	{"crash-between-commit-and-ack", crashBetweenCommitAndAck},
	{"error-retried-with-backoff", errorRetried},
	{"permanent-error-to-dlq", permanentErrorToDLQ},
	{"batch-mates-keep-their-effect", batchMatesKeepTheirEffect},
	{"panic-to-dlq", panicToDLQ},
	{"batch-of-events-sharing-entities", batchOfRelatedEvents},
	{"concurrent-events-on-one-entity", concurrentOnOneEntity},
	{"statement-error-retried", statementErrorRetried},
}

// duplicateInSequence delivers an event, then twice more under fresh
// message ids (past the broker's dedup, as a republish would): the
// duplicates change nothing, in any table.
func duplicateInSequence(t *testing.T, s *subject) {
	ev := s.newEvent(t)
	s.requireNoEffectYet(t, ev)
	s.start(t, hooks{})
	s.publish(t, ev, "")
	s.settled(t)
	s.requireOneEffect(t, ev, "after one delivery")
	before := snapshot(t, s.db)
	s.publish(t, ev, "")
	s.publish(t, ev, "")
	s.settled(t)
	s.requireOneEffect(t, ev, "after two more deliveries of the same event")
	requireSameTables(t, before, snapshot(t, s.db),
		"a duplicate delivery changed the database; the inbox claims the event before the handler runs, so the handler must write only through the tx it is given")
}

// duplicateConcurrent delivers one event six times at once to two
// consumers of the durable (two replicas of the service), each with two
// workers: the deliveries race, and one has an effect.
func duplicateConcurrent(t *testing.T, s *subject) {
	ev := s.newEvent(t)
	s.requireNoEffectYet(t, ev)
	for range 6 {
		s.publish(t, ev, "")
	}
	a, b := s.start(t, hooks{workers: 2}), s.start(t, hooks{workers: 2})
	s.settled(t)
	s.requireOneEffect(t, ev, "after six concurrent deliveries of one event to two replicas")
	if n := a.Stats().Processed + b.Stats().Processed; n != 1 {
		t.Errorf("the event was processed %d times by two replicas, not once", n)
	}
}

// crashBetweenCommitAndAck kills the consumer (closes its NATS
// connection, so the ack is lost with it) after its transaction committed
// and before its ack; a new consumer gets the redelivery, which the inbox
// drops as a duplicate: one effect.
func crashBetweenCommitAndAck(t *testing.T, s *subject) {
	ev := s.newEvent(t)
	s.requireNoEffectYet(t, ev)
	nc, js := s.conn(t)
	var killed atomic.Bool
	first := s.start(t, hooks{js: js, afterCommit: func(e Event) {
		if e.ID == ev.ID && killed.CompareAndSwap(false, true) {
			nc.Close() // the process dies: no ack leaves it
		}
	}})
	s.publish(t, ev, "")
	await(t, func() (bool, error) { return killed.Load(), nil }, "the event was never committed")
	_ = first.stop() // a killed consumer's error is its death
	s.requireOneEffect(t, ev, "after the commit and before the ack")

	second := s.start(t, hooks{})
	await(t, func() (bool, error) { return second.Stats().Duplicates+second.Stats().Processed > 0, nil },
		"the event whose ack was lost was not redelivered")
	s.settled(t)
	s.requireOneEffect(t, ev, "after a crash between commit and ack and the redelivery")
	if second.Stats().Processed != 0 {
		t.Errorf("the redelivery after a crash between commit and ack was processed again, not dropped as a duplicate")
	}
}

// errInjected is the failure the kit adds after a handler succeeded, as a
// failed commit would: the transaction rolls back and the event is retried.
var errInjected = errors.New("conformance: injected failure after the handler ran (as a failed commit)")

// errorRetried lets the handler run and then fails its transaction twice
// (after the handler succeeded, as a lost connection or a serialization
// failure would): the event is retried, with a growing delay, and its
// third run has the effect, once.
func errorRetried(t *testing.T, s *subject) {
	ev := s.newEvent(t)
	s.requireNoEffectYet(t, ev)
	c := s.cleanRun(t, []Event{ev})
	f := &failing{target: ev, left: 2}
	consumer := s.start(t, f.hooks(s))
	s.publish(t, ev, "")
	s.settled(t)
	if dl := s.deadLetterOf(t, ev); dl != nil {
		t.Fatalf("after two transient failures the event was dead-lettered (%s) instead of retried: "+
			"return transient errors as they are; only a payload that can never be applied is permanent", dl.Header.Get(headerReason))
	}
	if f.attempts() < 3 {
		t.Fatalf("the handler ran %d times; an event whose transaction failed twice runs three times", f.attempts())
	}
	s.requireOneEffect(t, ev, "after two attempts that rolled back and a third that committed (the handler must keep no state outside the tx it is given: not in memory, not in another connection)")
	if s.mode == reference {
		at := f.times()
		// The inbox naks with a delay that doubles at every delivery.
		if gap := at[1].Sub(at[0]); gap < nakDelay {
			t.Errorf("the first retry came %s after the failure; the inbox waits %s", gap, nakDelay)
		}
		if gap := at[2].Sub(at[1]); gap < 2*nakDelay {
			t.Errorf("the second retry came %s after the failure; the inbox waits %s (twice the first wait)", gap, 2*nakDelay)
		}
	}
	if consumer.Stats().Retried < 1 {
		t.Errorf("the failed event was not naked for a retry")
	}
	s.requireClean(t, c, "after two attempts that rolled back and a third that committed (the handler must keep no state outside the tx it is given: not in memory, not in another connection)")
}

// permanentErrorToDLQ delivers an event whose payload does not decode: the
// handler's decode error is permanent, so the event is dead-lettered at its
// first delivery, with the reason, and has no effect.
func permanentErrorToDLQ(t *testing.T, s *subject) {
	bad := s.poison(t)
	s.start(t, hooks{})
	s.publish(t, bad, "")
	s.settled(t)
	s.requireDeadLettered(t, bad)
}

// batchMatesKeepTheirEffect delivers a poison event between two good ones,
// all three in one batch: the poison one is dead-lettered and the others
// have their effect.
func batchMatesKeepTheirEffect(t *testing.T, s *subject) {
	good1, bad, good2 := s.newEvent(t), s.poison(t), s.newEvent(t)
	for _, ev := range []Event{good1, bad, good2} {
		s.publish(t, ev, "") // all three before the consumer starts: one batch
	}
	s.start(t, hooks{})
	s.settled(t)
	s.requireOneEffect(t, good1, "for the event delivered before a poison one in its batch")
	s.requireOneEffect(t, good2, "for the event delivered after a poison one in its batch")
	if s.deadLetterOf(t, bad) == nil {
		t.Errorf("the poison event of the batch was not dead-lettered")
	}
}

// poisonData is a payload no event type's payload decodes from: an array
// where every payload is an object.
const poisonData = `["not", "a", "payload"]`

// poison is a new event of the subscription whose payload does not decode.
func (s *subject) poison(t *testing.T) Event {
	t.Helper()
	ev := s.newEvent(t)
	ev.Data = []byte(poisonData)
	return ev
}

// headerReason is the dead letter's reason header (inbox.HeaderDLQReason).
const headerReason = "Onceflow-Dlq-Reason"

// requireDeadLettered checks that bad was dead-lettered at its first
// delivery, with a reason, and had no effect.
func (s *subject) requireDeadLettered(t *testing.T, bad Event) {
	t.Helper()
	dl := s.deadLetterOf(t, bad)
	if dl == nil {
		t.Fatalf("an event whose payload does not decode (%s) was acked, not dead-lettered: the handler swallowed the decode error. "+
			"Return Event.Decode's error (it wraps ErrInvalid), or wrap it with Permanent, so that the inbox dead-letters the event with its reason", poisonData)
	}
	if n, _ := strconv.Atoi(dl.Header.Get("Onceflow-Dlq-Deliveries")); n != 1 {
		t.Errorf("an event whose payload does not decode was delivered %d times before it was dead-lettered: a decode error is permanent. "+
			"Return Event.Decode's error as it is (it wraps ErrInvalid), or wrap it with Permanent, not in an error of your own that hides it", n)
	}
	if dl.Header.Get(headerReason) == "" {
		t.Errorf("the dead letter carries no reason")
	}
	if n := s.effect(t, bad); n != 0 {
		t.Errorf("the dead-lettered event has %d effects; a handler that fails must leave nothing behind", n)
	}
}

// requireNoEffectYet checks that Effect sees nothing of ev before it is
// delivered: otherwise it counts more than this event's effect.
func (s *subject) requireNoEffectYet(t *testing.T, ev Event) {
	t.Helper()
	if n := s.effect(t, ev); n != 0 {
		t.Fatalf("conformance: Effect counts %d for an event not delivered yet: it must count this event's effect only", n)
	}
}

// requireOneEffect checks that ev's effect is in the database once.
func (s *subject) requireOneEffect(t *testing.T, ev Event, when string) {
	t.Helper()
	if n := s.effect(t, ev); n != 1 {
		t.Fatalf("%s, Effect counts %d, not 1", when, n)
	}
}

// failing makes the transactions of its target event fail after its
// handler succeeded, as a failed commit would: its first left times, or
// every time while left is negative.
type failing struct {
	target Event
	mu     sync.Mutex
	left   int
	calls  []time.Time
}

func (f *failing) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, time.Now())
	if f.left == 0 {
		return nil
	}
	if f.left > 0 {
		f.left--
	}
	return errInjected
}

// heal lets the target event's transactions commit from now on.
func (f *failing) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = 0
}

func (f *failing) attempts() int { return len(f.times()) }

func (f *failing) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// hooks run s's handlers, failing the target's transactions.
func (f *failing) hooks(s *subject) hooks {
	h := hooks{handler: func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if err := s.sub.Handler(ctx, tx, ev); err != nil || ev.ID != f.target.ID {
			return err
		}
		return f.fail()
	}}
	if s.sub.BatchHandler != nil {
		h.batchHandler = func(ctx context.Context, tx pgx.Tx, evs []Event, writes *postgres.Pipeline) error {
			err := s.sub.BatchHandler(ctx, tx, evs, writes)
			if err != nil || !slices.ContainsFunc(evs, func(ev Event) bool { return ev.ID == f.target.ID }) {
				return err
			}
			return f.fail()
		}
	}
	return h
}

package conformance

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/postgres"
)

// relatedEvents is how many events the properties on shared entities send.
const relatedEvents = 4

// newEvents returns n new events of the subscription that share their
// entities (NewEvents), or n unrelated ones where it has no NewEvents.
func (s *subject) newEvents(t *testing.T, n int) []Event {
	t.Helper()
	if s.sub.NewEvents == nil {
		evs := make([]Event, n)
		for i := range evs {
			evs[i] = s.newEvent(t)
		}
		return evs
	}
	evs := s.sub.NewEvents(t, s.env, n)
	if len(evs) != n {
		t.Fatalf("conformance: NewEvents returned %d events, not %d", len(evs), n)
	}
	for _, ev := range evs {
		if err := ev.Validate(); err != nil {
			t.Fatalf("conformance: NewEvents returned an invalid event: %v", err)
		}
		s.requireNoEffectYet(t, ev)
	}
	return evs
}

// batchOfRelatedEvents delivers, in one batch, several good events that
// share their entities (one customer, one SKU): the batch commits with
// each event's effect once, and the tables hold what one clean run of
// them leaves (every outbox row, every debit of a shared wallet).
func batchOfRelatedEvents(t *testing.T, s *subject) {
	evs := s.newEvents(t, relatedEvents)
	c := s.cleanRun(t, evs)
	for _, ev := range evs {
		s.publish(t, ev, "") // all before the consumer starts: one batch
	}
	s.start(t, hooks{})
	s.settled(t)
	for i, ev := range evs {
		if n := s.effect(t, ev); n != 1 {
			t.Fatalf("event %d of %d good events delivered together has %d effects, not 1: "+
				"a batch shares one transaction, so the handler must apply each event once, whatever earlier events of the batch wrote (a set-based handler: every event it is given, not the first)",
				i+1, len(evs), n)
		}
	}
	s.requireClean(t, c, "after a batch of good events that share their entities")
}

// statementErrorRetried fails one statement of each event's handler once,
// inside its transaction (the first statement of the first event, the
// second of the second, …, savepoints included), as a serialization
// failure would: each event is retried, not dead-lettered, and applied
// once.
func statementErrorRetried(t *testing.T, s *subject) {
	evs := s.newEvents(t, relatedEvents)
	c := s.cleanRun(t, evs)
	inj := &injector{at: map[uuid.UUID]int{}, done: map[uuid.UUID]bool{}, batchDone: map[uuid.UUID]bool{}}
	for i, ev := range evs {
		inj.at[ev.ID] = min(i+1, c.statements[ev.ID])
	}
	s.start(t, inj.hooks(s))
	for _, ev := range evs {
		s.publish(t, ev, "")
	}
	s.settled(t)
	for i, ev := range evs {
		if dl := s.deadLetterOf(t, ev); dl != nil {
			t.Fatalf("event %d was dead-lettered (%s) after its statement %d failed once with a serialization failure, which a retry cures: "+
				"return a statement's error as it is, or wrapped with %%w; mark Permanent only an event no retry can apply (its payload), never a failed statement",
				i+1, dl.Header.Get(headerReason), inj.at[ev.ID])
		}
		if n := s.effect(t, ev); n != 1 {
			t.Fatalf("event %d has %d effects, not 1, after its statement %d failed once (a serialization failure): "+
				"return a statement's error; a handler that swallows it (a savepoint rolled back as if the row were recorded before) acks an event it never applied",
				i+1, n, inj.at[ev.ID])
		}
	}
	if missed := inj.missed(evs); missed > 0 {
		t.Fatalf("conformance: %d events ran without the statement failure meant for them", missed)
	}
	s.requireClean(t, c, "after a statement of each event's handler failed once")
}

// injector fails, once for each event, the statement at[ev] of its
// handler; and the first statement of the set-based handler's first call
// with each event (so that every event also reaches the handler, when the
// inbox processes the failed batch's events one by one).
type injector struct {
	mu        sync.Mutex
	at        map[uuid.UUID]int
	done      map[uuid.UUID]bool
	batchDone map[uuid.UUID]bool
}

func (inj *injector) hooks(s *subject) hooks {
	h := hooks{handler: func(ctx context.Context, tx pgx.Tx, ev Event) error {
		return s.sub.Handler(ctx, watch(tx, func(ctx context.Context, tx pgx.Tx, n int) error {
			inj.mu.Lock()
			fail := n == inj.at[ev.ID] && !inj.done[ev.ID]
			inj.done[ev.ID] = inj.done[ev.ID] || fail
			inj.mu.Unlock()
			if fail {
				return failStatement(ctx, tx)
			}
			return nil
		}), ev)
	}}
	if s.sub.BatchHandler != nil {
		h.batchHandler = func(ctx context.Context, tx pgx.Tx, evs []Event, writes *postgres.Pipeline) error {
			fail := inj.failBatch(evs)
			err := s.sub.BatchHandler(ctx, watch(tx, func(ctx context.Context, tx pgx.Tx, _ int) error {
				if fail {
					fail = false
					return failStatement(ctx, tx)
				}
				return nil
			}), evs, writes)
			if err == nil && fail {
				return errInjected // it ran no statement on tx: fail it after it ran
			}
			return err
		}
	}
	return h
}

// failBatch reports whether to fail the set-based handler's call with
// evs: when one of them has not seen a failed call yet.
func (inj *injector) failBatch(evs []Event) bool {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	fail := false
	for _, ev := range evs {
		fail = fail || !inj.batchDone[ev.ID]
		inj.batchDone[ev.ID] = true
	}
	return fail
}

func (inj *injector) missed(evs []Event) int {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	n := 0
	for _, ev := range evs {
		if !inj.done[ev.ID] {
			n++
		}
	}
	return n
}

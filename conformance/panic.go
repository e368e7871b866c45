package conformance

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/postgres"
)

// panicToDLQ delivers, in one batch, an event whose handler panics between
// two good ones: the panic is a failure of its message — retried, then
// dead-lettered with the panic as its reason — and the consumer and the
// batch-mates carry on.
func panicToDLQ(t *testing.T, s *subject) {
	good1, bad, good2 := s.newEvent(t), s.newEvent(t), s.newEvent(t)
	for _, ev := range []Event{good1, bad, good2} {
		s.publish(t, ev, "")
	}
	s.start(t, panicking(s, bad))
	await(t, func() (bool, error) { return s.deadLetterOf(t, bad) != nil, nil },
		"an event whose handler panics at each delivery was not dead-lettered")
	s.settled(t)
	if reason := s.deadLetterOf(t, bad).Header.Get(headerReason); !strings.Contains(reason, "panic") {
		t.Errorf("the panicking event was dead-lettered for %q, which does not say it panicked", reason)
	}
	if n := s.effect(t, bad); n != 0 {
		t.Errorf("the event whose handler panicked has %d effects", n)
	}
	s.requireOneEffect(t, good1, "for the event delivered before a panicking one in its batch")
	s.requireOneEffect(t, good2, "for the event delivered after a panicking one in its batch")
}

// panicking runs s's handlers, panicking for bad after they ran.
func panicking(s *subject, bad Event) hooks {
	h := hooks{handler: func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if err := s.sub.Handler(ctx, tx, ev); err != nil || ev.ID != bad.ID {
			return err
		}
		panic("conformance: the handler panicked")
	}}
	if s.sub.BatchHandler != nil {
		h.batchHandler = func(ctx context.Context, tx pgx.Tx, evs []Event, writes *postgres.Pipeline) error {
			for _, ev := range evs {
				if ev.ID == bad.ID {
					panic("conformance: the batch handler panicked")
				}
			}
			return s.sub.BatchHandler(ctx, tx, evs, writes)
		}
	}
	return h
}

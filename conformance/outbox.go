package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// emitsThroughTheOutbox checks what the handler emits: nothing is
// published while it runs (neither in a transaction that is then rolled
// back nor in one that commits), on any stream or key-value bucket of the
// server; each event it writes to the outbox has an id of its own; the
// relay publishes each outbox row once, each event with its id as its
// Nats-Msg-Id and from its stream's owner; and a re-drive of the outbox
// publishes nothing new, as the broker recognises the ids.
func emitsThroughTheOutbox(t *testing.T, s *subject) {
	ctx := t.Context()
	inputs, marks := map[string]bool{}, s.streamMarks(t)
	s.runRolledBack(t, inputs)
	requireNothingPublished(t, s.emitted(t, inputs, marks), "by a handler whose transaction was then rolled back")

	ev := s.newEvent(t)
	inputs[ev.ID.String()] = true
	s.start(t, hooks{})
	s.publish(t, ev, "")
	s.settled(t)
	s.requireOneEffect(t, ev, "after one delivery")
	requireNothingPublished(t, s.emitted(t, inputs, marks), "before the outbox relay ran")

	rows := s.outboxRows(t)
	relay := outbox.NewRelay(s.env.Pool, s.env.JS, outbox.RelayConfig{}, s.logger)
	if _, err := relay.Flush(ctx); err != nil {
		t.Fatalf("conformance: the outbox relay: %v", err)
	}
	published := s.emitted(t, inputs, marks)
	s.requirePublishedOnce(t, rows, published)

	if _, err := outbox.Redrive(ctx, s.env.Pool, time.Time{}); err != nil {
		t.Fatalf("conformance: re-drive the outbox: %v", err)
	}
	if _, err := relay.Flush(ctx); err != nil {
		t.Fatalf("conformance: the outbox relay: %v", err)
	}
	if again := s.emitted(t, inputs, marks); len(again) != len(published) {
		t.Errorf("a re-drive of the outbox published %d events again: an event's Nats-Msg-Id must be its id, stable, so that the broker drops a second publish",
			len(again)-len(published))
	}
}

// runRolledBack runs the Handler on a new event, and the BatchHandler on
// new events that share their entities, each in a transaction that it
// then rolls back, and adds the events to inputs.
func (s *subject) runRolledBack(t *testing.T, inputs map[string]bool) {
	t.Helper()
	ctx := t.Context()
	ev := s.newEvent(t)
	inputs[ev.ID.String()] = true
	tx, err := s.env.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("conformance: begin: %v", err)
	}
	herr := s.sub.Handler(ctx, tx, ev)
	_ = tx.Rollback(ctx)
	if herr != nil {
		t.Fatalf("the handler failed on a new event: %v", herr)
	}
	if s.sub.BatchHandler == nil {
		return
	}
	evs := s.newEvents(t, relatedEvents)
	for _, ev := range evs {
		inputs[ev.ID.String()] = true
	}
	tx, err = s.env.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("conformance: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var writes Pipeline
	if err := s.sub.BatchHandler(ctx, tx, evs, &writes); err != nil {
		t.Fatalf("the set-based handler failed on new events: %v", err)
	}
	if err := writes.Send(ctx, tx); err != nil {
		t.Fatalf("the set-based handler's queued writes failed on new events: %v", err)
	}
}

// requireNothingPublished fails the test if msgs holds anything.
func requireNothingPublished(t *testing.T, msgs []*jetstream.RawStreamMsg, when string) {
	t.Helper()
	if len(msgs) == 0 {
		return
	}
	var what []string
	for _, m := range msgs {
		what = append(what, m.Header.Get(event.HeaderType)+" on "+m.Subject)
	}
	t.Fatalf("%s was published %s: the handler published directly instead of through the outbox (a key-value put is a publish too, on its bucket's stream). "+
		"Write the event with outbox.Enqueue on the tx it is given; the relay publishes it after the commit, never before, and never if the transaction rolls back",
		strings.Join(what, ", "), when)
}

// outboxRow is an unsent row of the outbox.
type outboxRow struct {
	eventID, natsSubject, source string
}

// outboxRows returns the unsent rows of the outbox by event id, and fails
// the test if two rows share an id: the broker would drop the second.
func (s *subject) outboxRows(t *testing.T) map[string]outboxRow {
	t.Helper()
	rows, err := s.db.Query(t.Context(), `SELECT event_id::text, nats_subject, source FROM outbox_unsent`)
	if err != nil {
		t.Fatalf("conformance: read the outbox: %v", err)
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
		var r outboxRow
		err := row.Scan(&r.eventID, &r.natsSubject, &r.source)
		return r, err
	})
	if err != nil {
		t.Fatalf("conformance: read the outbox: %v", err)
	}
	out := map[string]outboxRow{}
	for _, r := range all {
		if _, ok := out[r.eventID]; ok {
			t.Fatalf("two outbox rows (on %s and %s) carry the same event id %s: the broker drops the second as a duplicate, and each consumer's inbox would too. "+
				"Make each event with event.New or Caused, which give it an id of its own; a copy of an envelope keeps the id of the original",
				out[r.eventID].natsSubject, r.natsSubject, r.eventID)
		}
		out[r.eventID] = r
	}
	return out
}

// requirePublishedOnce checks that each outbox row was published once,
// with its event id as its message id, from its stream's owner.
func (s *subject) requirePublishedOnce(t *testing.T, rows map[string]outboxRow, published []*jetstream.RawStreamMsg) {
	t.Helper()
	if len(published) != len(rows) {
		t.Fatalf("%d messages were published on the server for %d outbox rows: the handler emits only through the outbox (a key-value put or a publish of its own is a write outside its transaction)",
			len(published), len(rows))
	}
	for _, m := range published {
		id := m.Header.Get(event.HeaderID)
		if _, ok := rows[id]; !ok {
			t.Errorf("published event %s is not in the outbox", id)
		}
		if msgID := m.Header.Get(jetstream.MsgIDHeader); msgID != id {
			t.Errorf("event %s was published with Nats-Msg-Id %q: it must be the event's id", id, msgID)
		}
		if owner, src := s.topology.Owner(m.Subject), m.Header.Get(event.HeaderSource); owner != src {
			t.Errorf("%s was emitted with ce-source %q, but the owner of %s is %q: its consumers will dead-letter it",
				m.Header.Get(event.HeaderType), src, m.Subject, owner)
		}
	}
}

// replay dead-letters an event (its transaction fails at every delivery),
// lets the handler succeed, and replays the dead letter as an operator
// would (onceflow dlq replay: the original, re-read from its stream after
// the owner check): it is processed once. A replay of a
// processed event is then a duplicate: it changes nothing.
func replay(t *testing.T, s *subject) {
	ctx := t.Context()
	ev := s.newEvent(t)
	s.requireNoEffectYet(t, ev)
	f := &failing{target: ev, left: -1}
	s.start(t, f.hooks(s))
	s.publish(t, ev, "")
	await(t, func() (bool, error) { return s.deadLetterOf(t, ev) != nil, nil },
		"an event whose transaction failed at each of its %d deliveries was not dead-lettered", maxDeliver)
	if n := s.effect(t, ev); n != 0 {
		t.Fatalf("an event whose transactions all failed has %d effects", n)
	}
	f.heal()
	dead := s.deadLetterOf(t, ev)
	store := dlq.New(s.env.JS, dlq.Config{Topology: s.topology})
	if _, err := store.Replay(ctx, dead.Sequence, dlq.ReplayOptions{By: "conformance"}); err != nil {
		t.Fatalf("conformance: replay the dead letter: %v", err)
	}
	await(t, func() (bool, error) { return s.effect(t, ev) > 0, nil }, "the replayed dead letter was not processed")
	s.settled(t)
	s.requireOneEffect(t, ev, "after the dead letter was replayed")

	before := snapshot(t, s.db)
	s.publish(t, ev, streams.ReplaySubject(mustSubject(t, ev), s.sub.Durable))
	s.settled(t)
	s.requireOneEffect(t, ev, "after a processed event was replayed")
	requireSameTables(t, before, snapshot(t, s.db), "by the replay of a processed event, which is a duplicate")
}

func mustSubject(t *testing.T, ev Event) string {
	t.Helper()
	subj, err := ev.Type.NATSSubject()
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	return subj
}

// ownerCheck delivers an event that claims a source other than its
// type's owner, on its type's subject: it is dead-lettered, with no
// effect; the genuine event behind it has its effect.
func ownerCheck(t *testing.T, s *subject) {
	forged, genuine := s.newEvent(t), s.newEvent(t)
	forged.Source = "mallory"
	s.start(t, hooks{})
	s.publish(t, forged, "")
	s.publish(t, genuine, "")
	s.settled(t)
	dl := s.deadLetterOf(t, forged)
	if dl == nil {
		t.Fatalf("an event from %q, not its type's owner %q, was not dead-lettered", forged.Source, s.topology.Owner(mustSubject(t, forged)))
	}
	if reason := dl.Header.Get(headerReason); !strings.Contains(reason, "owner") {
		t.Errorf("the forged event was dead-lettered for %q, not for its owner", reason)
	}
	if n := s.effect(t, forged); n != 0 {
		t.Errorf("an event from %q, not its owner, has %d effects", forged.Source, n)
	}
	s.requireOneEffect(t, genuine, "for the genuine event behind a forged one")
}

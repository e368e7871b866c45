package conformance

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testenv"
)

// properties are the properties of the handler itself, checked once per
// subscription.
var properties = []property{
	{"writes-only-on-its-transaction", writesOnlyOnItsTransaction},
	{"emits-through-the-outbox", emitsThroughTheOutbox},
	{"replay", replay},
	{"accepts-events-only-from-their-owner", ownerCheck},
}

// writesOnlyOnItsTransaction runs the handler in a transaction and rolls
// it back: the handler must have changed the database in the transaction,
// left the transaction open, taken no connection of its own from the
// pool, and the rollback must leave every table as it was. The set-based
// handler, where there is one, is held to the same on events that share
// their entities, its queued writes sent on its transaction.
func writesOnlyOnItsTransaction(t *testing.T, s *subject) {
	ev := s.newEvent(t)
	s.requireWritesOnTx(t, "the handler", func(ctx context.Context, tx pgx.Tx) error {
		return s.sub.Handler(ctx, tx, ev)
	})
	if n := s.effect(t, ev); n != 0 {
		t.Errorf("after the handler's transaction was rolled back, Effect counts %d: the handler wrote outside its tx", n)
	}
	if s.sub.BatchHandler == nil {
		return
	}
	evs := s.newEvents(t, relatedEvents)
	s.requireWritesOnTx(t, "the set-based handler", func(ctx context.Context, tx pgx.Tx) error {
		var writes Pipeline
		if err := s.sub.BatchHandler(ctx, tx, evs, &writes); err != nil {
			return err
		}
		return writes.Send(ctx, tx)
	})
}

// requireWritesOnTx runs run (who) in a transaction that it then rolls
// back, and checks that who wrote through that transaction only.
func (s *subject) requireWritesOnTx(t *testing.T, who string, run func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	ctx := t.Context()
	before := snapshot(t, s.db)
	tx, err := s.env.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("conformance: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	acquired := s.env.Pool.Stat().AcquireCount()
	if err := run(ctx, tx); err != nil {
		t.Fatalf("%s failed on new events: %v", who, err)
	}
	if n := s.env.Pool.Stat().AcquireCount() - acquired; n > 0 {
		t.Errorf("%s took %d connections of its own from the pool while it ran: "+
			"it must read and write through the tx it is given (a write elsewhere escapes the inbox's rollback, and a second connection can wait on the inbox's own locks)", who, n)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the transaction %s was given is closed after it returned (%v): "+
			"it must never commit or roll back tx; return nil and the inbox commits, return an error and it rolls back", who, err)
	}
	if inTx := snapshot(t, tx); equalTables(before, inTx) {
		t.Errorf("%s changed nothing in the transaction it was given: it must write its effect through tx", who)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("conformance: rollback: %v", err)
	}
	requireSameTables(t, before, snapshot(t, s.db), "after "+who+"'s transaction was rolled back: "+
		"it wrote through a connection of its own (the pool, a second pool), not through the tx it is given; such a write outlives a rollback, and happens again at every redelivery")
}

// snapshot returns every row of every table q sees (testenv.Tables).
func snapshot(t *testing.T, q testenv.Querier) map[string]string {
	t.Helper()
	all, err := testenv.Tables(t.Context(), q)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	return all
}

func equalTables(a, b map[string]string) bool { return maps.Equal(a, b) }

// requireSameTables fails the test with why, naming the tables that
// differ, unless before and after are equal.
func requireSameTables(t *testing.T, before, after map[string]string, why string) {
	t.Helper()
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(after)) {
		if before[name] != after[name] {
			changed = append(changed, name)
		}
	}
	if len(changed) > 0 {
		t.Fatalf("tables %s changed %s", strings.Join(changed, ", "), why)
	}
}

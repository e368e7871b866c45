package conformance

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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
// pool, and the rollback must leave every table as it was.
func writesOnlyOnItsTransaction(t *testing.T, s *subject) {
	ctx := t.Context()
	ev := s.newEvent(t)
	before := snapshot(t, s.db)
	tx, err := s.env.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("conformance: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	acquired := s.env.Pool.Stat().AcquireCount()
	if err := s.sub.Handler(ctx, tx, ev); err != nil {
		t.Fatalf("the handler failed on a new event: %v", err)
	}
	if n := s.env.Pool.Stat().AcquireCount() - acquired; n > 0 {
		t.Errorf("the handler took %d connections of its own from the pool while it ran: "+
			"it must read and write through the tx it is given (a write elsewhere escapes the inbox's rollback, and a second connection can wait on the inbox's own locks)", n)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the transaction the handler was given is closed after it returned (%v): "+
			"the handler must never commit or roll back tx; return nil and the inbox commits, return an error and it rolls back", err)
	}
	if inTx := snapshot(t, tx); equalTables(before, inTx) {
		t.Errorf("the handler changed nothing in the transaction it was given: it must write its effect through tx")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("conformance: rollback: %v", err)
	}
	requireSameTables(t, before, snapshot(t, s.db),
		"after the handler's transaction was rolled back: the handler wrote through a connection of its own, not the tx it is given; such a write outlives a rollback, and happens again at every redelivery")
	if n := s.effect(t, ev); n != 0 {
		t.Errorf("after the handler's transaction was rolled back, Effect counts %d: the handler wrote outside its tx", n)
	}
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// snapshot returns every row of every table q sees, by table, as text in
// the order of the rows' text. Each row goes as its text: XML has no
// infinite timestamp (partition_floor holds one).
func snapshot(t *testing.T, q querier) map[string]string {
	t.Helper()
	rows, err := q.Query(t.Context(), `
		SELECT format('%I.%I', table_schema, table_name),
		       query_to_xml(format('SELECT r::text AS row FROM %I.%I AS r ORDER BY r::text', table_schema, table_name), true, false, '')::text
		FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Fatalf("conformance: read the tables: %v", err)
	}
	all := map[string]string{}
	var name, content string
	if _, err := pgx.ForEachRow(rows, []any{&name, &content}, func() error {
		all[name] = content
		return nil
	}); err != nil {
		t.Fatalf("conformance: read the tables: %v", err)
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

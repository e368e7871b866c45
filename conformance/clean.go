package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testenv"
)

// A clean run is what the handler leaves when each event is applied once,
// in order, with nothing going wrong: the kit runs the Handler on the
// events in a transaction of its own and rolls it back, twice. What the
// two runs agree on (each table's rows, on the columns whose values both
// runs wrote alike: not a now(), a random id or a sequence's next value) is
// what every scenario must end with, however often the events were
// retried, redelivered, batched or raced: the outbox rows and every table,
// counted row by row, not by id.

// clean is the tables of a clean run, on its stable columns.
type clean struct {
	// stable is, per table, the columns both runs wrote alike.
	stable map[string][]string
	// rows is, per table, the first run's rows on the stable columns,
	// sorted.
	rows map[string][]string
	// statements is, per event, how many statements the handler ran on
	// its tx.
	statements map[uuid.UUID]int
}

// ignored are the tables a clean run cannot match: the inbox's claims,
// which the kit's run has no reason to write, and the relay's records.
var ignored = []string{"public.processed_events", "public.outbox_sent", "public.outbox_batch", "public.outbox_redrive"}

// cleanRun runs the subscription's Handler on evs, in order, in a
// transaction that is rolled back, twice, and returns what the runs agree
// on. Two runs that leave different numbers of rows fail the test: the
// handler keeps state outside its transaction.
func (s *subject) cleanRun(t *testing.T, evs []Event) *clean {
	t.Helper()
	statements := map[uuid.UUID]int{}
	first, second := s.rolledBackRun(t, evs, statements), s.rolledBackRun(t, evs, nil)
	c := &clean{stable: map[string][]string{}, rows: map[string][]string{}, statements: statements}
	for name, rows := range first {
		if slices.Contains(ignored, name) {
			continue
		}
		if len(rows) != len(second[name]) {
			t.Fatalf("two runs of the same %d events, each in a transaction rolled back, left %d and %d rows in %s: "+
				"the handler must keep no state outside the tx it is given (not in memory, not in another connection): a retry must do what the rolled-back attempt did",
				len(evs), len(rows), len(second[name]), name)
		}
		c.stable[name] = stableColumns(rows, second[name])
		c.rows[name] = project(rows, c.stable[name])
	}
	return c
}

// rolledBackRun runs the Handler on evs in one transaction and returns
// the tables as the transaction saw them before it was rolled back; it
// counts the statements of each event's handler into statements.
func (s *subject) rolledBackRun(t *testing.T, evs []Event, statements map[uuid.UUID]int) map[string][]map[string]json.RawMessage {
	t.Helper()
	ctx := t.Context()
	tx, err := s.env.Pool.Begin(ctx)
	if err != nil {
		t.Fatalf("conformance: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, ev := range evs {
		w := watch(tx, func(context.Context, pgx.Tx, int) error { return nil })
		if err := s.sub.Handler(ctx, w, ev); err != nil {
			t.Fatalf("the handler failed on a new event, in a transaction of the kit's: %v", err)
		}
		if statements != nil {
			statements[ev.ID] = *w.n
		}
	}
	rows, err := testenv.Rows(ctx, tx)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	return rows
}

// requireClean fails the test unless the database holds what c does,
// table by table and row by row.
func (s *subject) requireClean(t *testing.T, c *clean, when string) {
	t.Helper()
	now, err := testenv.Rows(t.Context(), s.db)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	var diffs []string
	for _, name := range slices.Sorted(maps.Keys(c.rows)) {
		want, got := c.rows[name], project(now[name], c.stable[name])
		if !slices.Equal(want, got) {
			diffs = append(diffs, fmt.Sprintf("%s holds %d rows where a clean run leaves %d%s", name, len(got), len(want), firstDiff(want, got)))
		}
	}
	if len(diffs) > 0 {
		t.Fatalf("%s, the tables differ from one clean run of the events (each applied once, in order): %s. "+
			"Every write of the handler must go through the tx it is given, once per event however the events are batched, retried or raced; "+
			"a row it reads and then updates must be locked (SELECT … FOR UPDATE, or one UPDATE that computes the new value)",
			when, strings.Join(diffs, "; "))
	}
}

// firstDiff names a row one side holds and the other does not.
func firstDiff(want, got []string) string {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return ", missing " + w
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			return ", unexpected " + g
		}
	}
	return ""
}

// stableColumns returns the columns whose values a and b hold alike.
func stableColumns(a, b []map[string]json.RawMessage) []string {
	if len(a) == 0 {
		return nil
	}
	var cols []string
	for _, col := range slices.Sorted(maps.Keys(a[0])) {
		if slices.Equal(project(a, []string{col}), project(b, []string{col})) {
			cols = append(cols, col)
		}
	}
	return cols
}

// project returns rows on cols, each as JSON, sorted: a multiset one
// compares with slices.Equal.
func project(rows []map[string]json.RawMessage, cols []string) []string {
	out := make([]string, 0, len(rows))
	for _, row := range rows {
		var b strings.Builder
		for _, col := range cols {
			fmt.Fprintf(&b, "%s=%s ", col, row[col])
		}
		out = append(out, strings.TrimSpace(b.String()))
	}
	slices.Sort(out)
	return out
}

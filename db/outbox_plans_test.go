package db_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestTheRelayReadsABatchWhateverTheOutboxHolds runs the relay's claim
// (Claim, with a generic plan as the relay runs it) and the view of unsent
// rows on an outbox of many sent rows and a few unsent, with a position
// recorded while a transaction whose rows lie below it was open, and with a
// span open in a backlog, and requires that no step of either reads more
// rows than about a batch: there is no index of unsent rows, and a plan
// that finds them by reading the sent ones would cost the whole table at
// every claim.
func TestTheRelayReadsABatchWhateverTheOutboxHolds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.NewServiceDatabase(t, "").Pool
	const sent, unsent, batch = 60000, 300, 256
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	// The late transaction's rows first (the lowest ids), then the rest,
	// then a position past all but the last unsent rows, recorded while the
	// late transaction was open.
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 's', 'late', 'orders.placed.v1', now(), '{}' FROM generate_series(1, 5)`)
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 's', 'order-' || n, 'orders.placed.v1', now(), '{}' FROM generate_series(1, ` + strconv.Itoa(sent+unsent) + `) AS n`)
	record := func(spanUpto, spanDone string) {
		exec(`INSERT INTO outbox_batch (snap, upto, span_snap, span_upto, span_done, epoch, system_id)
			SELECT s, ` + strconv.Itoa(sent+5) + `, s, ` + spanUpto + `, ` + spanDone + `, 0, outbox_system_id()
			FROM (SELECT format('%s:%s:%s', l.x, pg_snapshot_xmax(pg_current_snapshot()), l.x)::pg_snapshot AS s
			      FROM (SELECT xact_id AS x FROM outbox WHERE id = 1) AS l) AS p`)
	}
	record(strconv.Itoa(sent+5), strconv.Itoa(sent+5))
	exec(`ANALYZE`)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	claim := strings.NewReplacer("@epoch", "$1", "@snap", "$2", "@upto", "$3", "@span_snap", "$4",
		"@span_upto", "$5", "@span_done", "$6", "@batch_size", "$7").Replace(queryOf(t, "outbox", "Claim"))
	_, err = conn.Exec(ctx, `PREPARE claim AS `+claim)
	require.NoError(t, err)
	readsABatch := func(name, sql string) {
		t.Helper()
		plan := explainAnalyze(ctx, t, conn, sql)
		for _, m := range regexp.MustCompile(`(?:actual rows=|Rows Removed by Filter: )(\d+)`).FindAllStringSubmatch(plan, -1) {
			n, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			require.LessOrEqual(t, n, 2*batch, "%s reads more than a batch of rows:\n%s", name, plan)
		}
		require.Contains(t, plan, "rows=", name)
	}
	recorded := `EXECUTE claim(-1, '1:1:', 0, '1:1:', 0, 0, ` + strconv.Itoa(batch) + `)`
	readsABatch("Claim", recorded)
	readsABatch("UnsentLag", queryOf(t, "outbox", "UnsentLag"))

	// A span open over the backlog: the claim reads on from where it is.
	record(strconv.Itoa(sent+unsent+5), strconv.Itoa(sent+100))
	readsABatch("Claim in a span", recorded)
	readsABatch("UnsentLag in a span", queryOf(t, "outbox", "UnsentLag"))
}

// queryOf is the text of the query name in db/queries/dir, without its
// comments.
func queryOf(t *testing.T, dir, name string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("queries", dir, "*.sql"))
	require.NoError(t, err)
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		_, after, ok := strings.Cut(string(text), "-- name: "+name+" ")
		if !ok {
			continue
		}
		body, _, _ := strings.Cut(after, "-- name: ")
		var lines []string
		for _, l := range strings.Split(body, "\n")[1:] {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				lines = append(lines, l)
			}
		}
		return strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";")
	}
	t.Fatalf("no query %s in db/queries/%s", name, dir)
	return ""
}

// explainAnalyze runs sql under EXPLAIN ANALYZE and returns the plan.
func explainAnalyze(ctx context.Context, t *testing.T, conn *pgxpool.Conn, sql string) string {
	t.Helper()
	rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+sql)
	require.NoError(t, err, sql)
	return planText(t, rows)
}

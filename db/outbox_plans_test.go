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
// (ClaimUnsent, with a generic plan as the relay runs it) and the view of
// unsent rows on an outbox of many sent rows and a few unsent, with a
// position recorded by a mark and a transaction open at it whose rows lie
// below it, and requires that no step of either reads more rows than about
// a batch: an index of unsent rows no longer exists, and a plan that finds
// them by reading the sent ones would cost the whole table at every claim.
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
	// then the marks of all but the last unsent, the last of them with
	// the position past them and the late transaction open at it.
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 's', 'late', 'orders.placed.v1', now(), '{}' FROM generate_series(1, 5)`)
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 's', 'order-' || n, 'orders.placed.v1', now(), '{}' FROM generate_series(1, ` + strconv.Itoa(sent+unsent) + `) AS n`)
	exec(`INSERT INTO outbox_sent (id, created_at, sent_at, resume_id, resume_xmax, resume_xip)
		SELECT id, created_at, now(),
		       CASE WHEN id = last THEN last + 1 END,
		       CASE WHEN id = last THEN pg_snapshot_xmax(pg_current_snapshot()) END,
		       CASE WHEN id = last THEN ARRAY[(SELECT xact_id FROM outbox WHERE id = 1)] END
		FROM outbox, (SELECT ` + strconv.Itoa(sent) + ` + 5 AS last) AS l
		WHERE id BETWEEN 6 AND last`)
	exec(`ANALYZE`)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	claim := strings.NewReplacer("@in_flight", "$1", "@batch_size", "$2").Replace(queryOf(t, "outbox", "ClaimUnsent"))
	_, err = conn.Exec(ctx, `PREPARE claim AS `+claim)
	require.NoError(t, err)
	for name, sql := range map[string]string{
		"ClaimUnsent": `EXECUTE claim('{}', ` + strconv.Itoa(batch) + `)`,
		"UnsentLag":   queryOf(t, "outbox", "UnsentLag"),
	} {
		plan := explainAnalyze(ctx, t, conn, sql)
		for _, m := range regexp.MustCompile(`(?:actual rows=|Rows Removed by Filter: )(\d+)`).FindAllStringSubmatch(plan, -1) {
			n, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			require.LessOrEqual(t, n, 2*batch, "%s reads more than a batch of rows:\n%s", name, plan)
		}
		require.Contains(t, plan, "rows=", name)
	}
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

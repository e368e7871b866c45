package db_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestBatchUpdatesProbeTheirKeysWhenPlannedOnAnEmptyTable plans the
// set-based updates (UPDATE joined to arrays with unnest) that batch
// handlers send after the inbox's PlanGeneric, generically as they run, on a
// fresh database whose tables are empty and were never analyzed, and
// requires that each reads its target through an index.
//
// A generic plan is made once per connection and kept until the table is
// analyzed. Made on a nearly empty table, a join on the key alone is a hash
// join over a sequential scan, which then reads the whole table at every
// call as it grows: in a fresh `onceflow dev` at 300 orders/s, the orders'
// status updates read 8.4 million rows in the 16 seconds before the first
// autoanalyze, at 0.5 ms a call. Naming the keys with = ANY gives the
// planner an index condition whatever it believes of the table's size.
func TestBatchUpdatesProbeTheirKeysWhenPlannedOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	// Every set-based update of the services, by service: true for those a
	// batch handler sends, false for those planned per call as PostgreSQL
	// chooses (a statement added here must be placed in one or the other).
	updates := map[string]map[string]bool{
		"order":     {"SetOrderStatuses": true, "MarkLate": true},
		"payment":   {"DebitWallets": true},
		"inventory": {"DecrementStock": true, "IncrementStock": false},
		// The mailer's, after a failed delivery.
		"notify": {"MarkNotificationAttemptsFailed": false},
	}
	// Every service's, so that a new one's are checked too.
	sets, err := os.ReadDir("migrations")
	require.NoError(t, err)
	for _, set := range sets {
		service := set.Name()
		if service == db.Platform {
			continue
		}
		generic := updates[service]
		stmts := setBasedUpdates(t, filepath.Join("queries", service))
		names := make(map[string]bool, len(stmts))
		for _, s := range stmts {
			names[s.name] = true
		}
		require.Equal(t, slices.Sorted(maps.Keys(generic)), slices.Sorted(maps.Keys(names)),
			"the set-based updates of db/queries/%s", service)
		var pool *pgxpool.Pool
		for _, s := range stmts {
			if !generic[s.name] {
				continue
			}
			if pool == nil {
				pool = testenv.NewServiceDatabase(t, service).Pool
			}
			t.Run(s.name, func(t *testing.T) {
				plan := genericPlan(t, pool, s.sql)
				require.NotRegexp(t, `Seq Scan on `+s.target+`\b`, plan,
					"%s's generic plan on an empty table reads all of %s", s.name, s.target)
			})
		}
	}
}

type statement struct{ name, target, sql string }

var (
	nameLine = regexp.MustCompile(`(?m)^-- name: (\w+) :\w+\s*$`)
	update   = regexp.MustCompile(`(?is)^UPDATE\s+(\w+)\b.*\bunnest\(`)
	param    = regexp.MustCompile(`@(\w+)`)
)

// setBasedUpdates returns the set-based updates among the queries of dir,
// with sqlc's @name parameters numbered as PostgreSQL's $n.
func setBasedUpdates(t *testing.T, dir string) []statement {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	require.NoError(t, err)
	var stmts []statement
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		names := nameLine.FindAllStringSubmatchIndex(string(text), -1)
		for i, m := range names {
			end := len(text)
			if i+1 < len(names) {
				end = names[i+1][0]
			}
			var lines []string
			for _, l := range strings.Split(string(text[m[1]:end]), "\n") {
				if !strings.HasPrefix(strings.TrimSpace(l), "--") {
					lines = append(lines, l)
				}
			}
			body := strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";")
			u := update.FindStringSubmatch(body)
			if u == nil {
				continue
			}
			numbers := map[string]string{}
			body = param.ReplaceAllStringFunc(body, func(p string) string {
				if _, ok := numbers[p]; !ok {
					numbers[p] = "$" + strconv.Itoa(len(numbers)+1)
				}
				return numbers[p]
			})
			stmts = append(stmts, statement{name: string(text[m[2]:m[3]]), target: u[1], sql: body})
		}
	}
	return stmts
}

// genericPlan prepares sql on one connection, forced to generic plans as a
// batch's writes are, and returns the plan of an execution.
func genericPlan(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// A session's prepared statements outlive its transactions.
	defer func() { _, _ = conn.Exec(ctx, `DEALLOCATE set_based`) }()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE set_based AS `+sql)
	require.NoError(t, err, sql)
	var nparams int
	require.NoError(t, tx.QueryRow(ctx, `SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 'set_based'`).Scan(&nparams))
	args := strings.TrimSuffix(strings.Repeat("NULL, ", nparams), ", ")
	rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE set_based(`+args+`)`)
	require.NoError(t, err)
	return planText(t, rows)
}

// planText reads the lines of an EXPLAIN.
func planText(t *testing.T, rows pgx.Rows) string {
	t.Helper()
	defer rows.Close()
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	return plan.String()
}

// TestTheExpirerReadsTheOpenOrdersDeadlines plans the expirer's queries and
// requires that the partial index of the open orders' deadlines can serve
// them, in deadline order, without the orders table whole: the expirer runs
// every second, and the terminal orders, nearly all of them, are not in that
// index. Sequential scans, bitmap scans and sorts are disabled so that the
// plan says whether the index can serve the query (a predicate that does not
// imply the index's makes it unusable), whatever the planner thinks of an
// empty table.
func TestTheExpirerReadsTheOpenOrdersDeadlines(t *testing.T) {
	t.Parallel()
	pool := testenv.NewServiceDatabase(t, "order").Pool
	ctx := t.Context()
	// Each query's WHERE clause, as db/queries/order/orders.sql has it
	// (the test checks), with constants for its parameters.
	for name, where := range map[string]string{
		"ClaimDueOrders": `WHERE status IN ('PENDING', 'PAID') AND deadline <= @now::timestamptz`,
		"NextDeadline":   `WHERE status IN ('PENDING', 'PAID') AND deadline IS NOT NULL`,
	} {
		require.Contains(t, queryText(t, name), where, "the test's copy of %s is stale", name)
		sql := `SELECT id FROM orders ` + strings.ReplaceAll(where, "@now", "now()") + ` ORDER BY deadline LIMIT 100`
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off`)
		require.NoError(t, err)
		var plan strings.Builder
		rows, err := tx.Query(ctx, `EXPLAIN (COSTS OFF) `+sql)
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.NoError(t, tx.Rollback(ctx))
		require.Contains(t, plan.String(), "orders_deadline_idx", "%s does not read the deadlines' index:\n%s", name, plan.String())
	}
}

// queryText is the text of the query name in db/queries/order.
func queryText(t *testing.T, name string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("queries", "order", "orders.sql"))
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(text), "-- name: "+name+" ")
	require.True(t, ok, "no query %s", name)
	body, _, _ := strings.Cut(after, "-- name: ")
	return body
}

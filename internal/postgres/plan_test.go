package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A statement prepared while its table was small (and analyzed so) keeps a
// sequential scan after the table grew; through PlanEachCall it is planned
// for the table it runs on.
func TestPlanEachCallPlansForTheTableAsItIs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		wrap     func(pgx.Tx) pgx.Tx
		seqScans bool
	}{
		{"prepared", func(tx pgx.Tx) pgx.Tx { return tx }, true},
		{"plan each call", postgres.PlanEachCall, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			platform, err := postgres.ServiceSchema("")
			require.NoError(t, err)
			pool := testenv.NewDatabase(t, platform).Pool
			ctx := t.Context()
			_, err = pool.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items VALUES (1), (2), (3); ANALYZE items`)
			require.NoError(t, err)

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			db := tc.wrap(tx)
			ids := []int32{1, 2, 3, 40000, 50000, 60000, 70000, 80000, 90000, 99999}
			count := func() (n int) {
				require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM items WHERE id = ANY($1::int[])`, ids).Scan(&n))
				return n
			}
			// Past the five calls after which PostgreSQL may switch a
			// prepared statement to its generic plan.
			for range 8 {
				require.Equal(t, 3, count())
			}
			_, err = tx.Exec(ctx, `INSERT INTO items SELECT generate_series(4, 100000)`)
			require.NoError(t, err)
			var before, after int64
			scans := `SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'items'`
			require.NoError(t, tx.QueryRow(ctx, scans).Scan(&before))
			require.Equal(t, len(ids), count())
			require.NoError(t, tx.QueryRow(ctx, scans).Scan(&after))
			require.Equal(t, tc.seqScans, after > before, "sequential scans %d → %d", before, after)
		})
	}
}

package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestPipelineSendsItsStatementsInOrderInTheTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, "")
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE effects (n int PRIMARY KEY)")
	require.NoError(t, err)
	effects := func() []int32 {
		rows, _ := db.Pool.Query(ctx, "SELECT n FROM effects ORDER BY n")
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		return ns
	}

	for _, tc := range []struct {
		name    string
		queue   func(p *postgres.Pipeline)
		wantErr string // empty: committed
		want    []int32
	}{
		{
			name: "in order",
			queue: func(p *postgres.Pipeline) {
				exec(t, p, "INSERT INTO effects VALUES (1), (2)")
				p.Affects(2)
				exec(t, p, "UPDATE effects SET n = n * 10")
			},
			want: []int32{10, 20},
		},
		{
			name: "a failed statement, named after sqlc's query",
			queue: func(p *postgres.Pipeline) {
				exec(t, p, "INSERT INTO effects VALUES (3)")
				exec(t, p, "-- name: Twice :exec\nINSERT INTO effects VALUES (3)")
				exec(t, p, "INSERT INTO effects VALUES (4)")
			},
			wantErr: "Twice: ERROR: duplicate key",
		},
		{
			name: "rows affected other than expected",
			queue: func(p *postgres.Pipeline) {
				exec(t, p, "-- name: Missing :exec\nUPDATE effects SET n = 0 WHERE n = 99")
				p.Affects(1)
			},
			wantErr: "Missing: 0 rows affected, 1 expected",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Pool.Exec(ctx, "TRUNCATE effects")
			require.NoError(t, err)
			var p postgres.Pipeline
			tc.queue(&p)
			require.Empty(t, effects(), "run before Send")
			var after []error
			p.AfterSend(func(err error) { after = append(after, err) })

			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			err = p.Send(ctx, tx)
			require.Len(t, after, 1)
			require.Equal(t, err, after[0])
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, tc.want, effects())
		})
	}
}

func TestPipelineRefusesStatementsWithRows(t *testing.T) {
	t.Parallel()
	var p postgres.Pipeline
	_, err := p.Query(t.Context(), "SELECT 1")
	require.Error(t, err)
	require.Error(t, p.QueryRow(t.Context(), "SELECT 1").Scan())
	require.NoError(t, p.Send(t.Context(), nil), "nothing was queued, so nothing is sent")
}

func exec(t *testing.T, p *postgres.Pipeline, sql string) {
	t.Helper()
	_, err := p.Exec(context.Background(), sql)
	require.NoError(t, err)
}

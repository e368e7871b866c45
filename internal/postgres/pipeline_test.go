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
			name: "counts reported",
			queue: func(p *postgres.Pipeline) {
				var inserted, selected, none int64 = -1, -1, -1
				exec(t, p, "INSERT INTO effects VALUES (1), (2), (3)")
				p.CountInto(&inserted)
				exec(t, p, "SELECT 1 FROM effects WHERE n > 1")
				p.CountInto(&selected)
				exec(t, p, "SELECT 1 WHERE false")
				p.CountInto(&none)
				p.AfterSend(func(error) {
					require.Equal(t, []int64{3, 2, 0}, []int64{inserted, selected, none})
				})
			},
			want: []int32{1, 2, 3},
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

// Then sends the queued statements and one that answers in one round trip:
// its answer sees their writes, and a failure among them is its error.
func TestPipelineThenAnswersAfterTheQueuedStatements(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, "")
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE effects (n int PRIMARY KEY)")
	require.NoError(t, err)
	const count = "SELECT count(*) FROM effects"

	queued := func(sql string) (*postgres.Pipeline, *[]error) {
		var p postgres.Pipeline
		exec(t, &p, sql)
		var after []error
		p.AfterSend(func(err error) { after = append(after, err) })
		return &p, &after
	}

	t.Run("QueryRow, in a transaction", func(t *testing.T) {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		p, after := queued("INSERT INTO effects VALUES (1), (2)")
		var n int
		require.NoError(t, p.Then(tx).QueryRow(ctx, count).Scan(&n))
		require.Equal(t, 2, n)
		require.Equal(t, []error{nil}, *after)
		require.NoError(t, tx.Rollback(ctx), "the transaction is usable after the round trip")
	})

	t.Run("Query and Exec, on a pooled connection", func(t *testing.T) {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		p, _ := queued("INSERT INTO effects VALUES (3)")
		rows, err := p.Then(conn).Query(ctx, "SELECT n FROM effects ORDER BY n")
		require.NoError(t, err)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		require.Equal(t, []int32{3}, ns)

		p, _ = queued("INSERT INTO effects VALUES (4)")
		tag, err := p.Then(conn).Exec(ctx, "DELETE FROM effects")
		require.NoError(t, err)
		require.EqualValues(t, 2, tag.RowsAffected())
		require.NoError(t, conn.Ping(ctx), "the connection is free again")
	})

	t.Run("a queued statement failed", func(t *testing.T) {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		p, after := queued("-- name: Broken :exec\nINSERT INTO nowhere VALUES (1)")
		var n int
		err = p.Then(conn).QueryRow(ctx, count).Scan(&n)
		require.ErrorContains(t, err, "Broken: ")
		require.ErrorContains(t, err, `relation "nowhere" does not exist`)
		require.Len(t, *after, 1)
		require.Equal(t, err, (*after)[0])
		require.NoError(t, conn.Ping(ctx), "the connection is free again")
	})

	t.Run("the last statement failed: outside a transaction, the queued writes are undone", func(t *testing.T) {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		p, after := queued("INSERT INTO effects VALUES (5)")
		var n int
		require.Error(t, p.Then(conn).QueryRow(ctx, "SELECT 1/0").Scan(&n))
		require.Equal(t, []error{nil}, *after, "the queued statement itself succeeded")
		require.NoError(t, conn.QueryRow(ctx, count).Scan(&n))
		require.Zero(t, n, "one implicit transaction")
	})
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

package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pipeline is a sqlc DBTX that queues the statements of :exec and :execrows
// methods and sends them in one round trip with Send: for the writes at the
// end of a set-based batch, none of which needs the answer of another. On
// this project's machine a round trip costs more than a small statement.
//
// A queued statement has not run when its method returns: the method
// reports no error and no rows affected. Send reports the first statement
// that failed, and Affects checks a row count.
type Pipeline struct {
	batch pgx.Batch
	rows  []int64 // per statement, the rows it must affect, or -1
	after []func(error)
}

// errNeedsRows is the answer to a statement whose rows the caller needs at
// once, which a pipeline cannot give.
var errNeedsRows = errors.New("postgres: a pipeline queues statements without rows only")

// Exec queues the statement.
func (p *Pipeline) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	p.batch.Queue(sql, args...)
	p.rows = append(p.rows, -1)
	return pgconn.CommandTag{}, nil
}

// Query refuses: the caller needs the rows before Send.
func (p *Pipeline) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errNeedsRows
}

// QueryRow refuses: the caller needs the row before Send.
func (p *Pipeline) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{errNeedsRows}
}

// Affects makes Send fail unless the statement queued last affects n rows.
func (p *Pipeline) Affects(n int64) { p.rows[len(p.rows)-1] = n }

// AfterSend registers f to be called with Send's error once the statements
// have run (e.g. to end their spans).
func (p *Pipeline) AfterSend(f func(error)) { p.after = append(p.after, f) }

// Send runs the queued statements on tx, in order, in one round trip. An
// error names the statement (sqlc's query name) that failed; the ones after
// it did not run, and tx is aborted. A Pipeline is sent once.
func (p *Pipeline) Send(ctx context.Context, tx pgx.Tx) (err error) {
	defer func() {
		for _, f := range p.after {
			f(err)
		}
	}()
	if p.batch.Len() == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, &p.batch)
	for i, q := range p.batch.QueuedQueries {
		tag, err := br.Exec()
		if err == nil && p.rows[i] >= 0 && tag.RowsAffected() != p.rows[i] {
			err = fmt.Errorf("%d rows affected, %d expected", tag.RowsAffected(), p.rows[i])
		}
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("%s: %w", queryName(q.SQL), err)
		}
	}
	return br.Close()
}

// queryName is the name sqlc gives a query in its first line
// ("-- name: DebitWallets :execrows"), or the start of the statement.
func queryName(sql string) string {
	first, _, _ := strings.Cut(sql, "\n")
	if name, ok := strings.CutPrefix(first, "-- name: "); ok {
		name, _, _ = strings.Cut(name, " ")
		return name
	}
	return first[:min(len(first), 40)]
}

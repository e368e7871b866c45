package postgres

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// WriteBehindTx is a transaction whose :exec statements are queued; see
// WriteBehind. It is not safe for concurrent use, as a pgx.Tx is not.
type WriteBehindTx struct {
	pgx.Tx
	queue *queue
	owner int
	err   *WriteError
}

// queue is a pipeline and who queued its statements.
type queue struct {
	writes *Pipeline
	owners []owned // by position, in order
}

// owned marks the statements of a pipeline from position from on as
// owner's.
type owned struct{ from, owner int }

// WriteError is the failure of a statement that a WriteBehindTx queued.
type WriteError struct {
	Owner int // the owner that queued it (see Own)
	Err   error
}

func (e *WriteError) Error() string { return e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// WriteBehind returns tx with its sqlc :exec statements queued instead of
// sent: they go to the server ahead of the next statement that answers (a
// read, an :execrows, anything else), in its round trip, and the ones still
// queued at the end go with the COMMIT (send Writes with TxStart.Commit).
// A handler that reads, then writes twice, costs one round trip instead of
// three, and the writes of one event go with the next event's read.
//
// An :exec method reports only an error, and the order of the statements
// on the connection is kept, so the transaction ends as it would have: only
// when an :exec fails changes. The failure then comes back from the next
// statement that is sent (which did not run) or from the COMMIT, and Err
// keeps it, with the owner that queued it. Code that must act on an
// :exec's failure (e.g. a unique violation) reads its outcome instead: an
// :execrows, a :one, or ON CONFLICT in the statement.
func WriteBehind(tx pgx.Tx) *WriteBehindTx {
	t := &WriteBehindTx{Tx: tx}
	t.reset()
	return t
}

// Own makes owner (e.g. the index of the event being handled) the owner of
// the statements queued from now on, which a WriteError names.
func (t *WriteBehindTx) Own(owner int) {
	t.owner = owner
	t.queue.owners = append(t.queue.owners, owned{from: t.queue.writes.Len(), owner: owner})
}

// Writes is the pipeline of the statements still queued. Statements queued
// on it directly (outbox.Queue) are the current owner's. Once it is sent
// (as TxStart.Commit sends it), the transaction queues on a new one.
func (t *WriteBehindTx) Writes() *Pipeline { return t.queue.writes }

// Err is the first failure of a queued statement, or nil.
func (t *WriteBehindTx) Err() *WriteError { return t.err }

// reset starts a new pipeline, after the last one was sent.
func (t *WriteBehindTx) reset() {
	q := &queue{writes: &Pipeline{}, owners: []owned{{from: 0, owner: t.owner}}}
	q.writes.AfterSend(func(err error) {
		var qe *QueryError
		if t.err != nil || !errors.As(err, &qe) {
			return
		}
		owner := q.owners[0].owner
		for _, o := range q.owners {
			if o.from <= qe.Index {
				owner = o.owner
			}
		}
		t.err = &WriteError{Owner: owner, Err: err}
	})
	t.queue = q
}

// then is the DBTX of a statement that needs an answer: the queued
// statements go ahead of it, and a new pipeline is started.
func (t *WriteBehindTx) then() DBTX {
	if t.queue.writes.Len() == 0 {
		return t.Tx
	}
	db := t.queue.writes.Then(t.Tx)
	t.reset()
	return db
}

// flush sends the queued statements on their own, for the calls that
// cannot go in their round trip.
func (t *WriteBehindTx) flush(ctx context.Context) error {
	if t.queue.writes.Len() == 0 {
		return nil
	}
	p := t.queue.writes
	t.reset()
	return p.Send(ctx, t.Tx)
}

// isExec reports whether sql is a sqlc :exec query, whose method reports
// no more than an error.
func isExec(sql string) bool {
	first, _, _ := strings.Cut(sql, "\n")
	return strings.HasPrefix(first, "-- name: ") && strings.HasSuffix(strings.TrimSpace(first), " :exec")
}

// Exec queues an :exec query and sends anything else after the queued
// statements.
func (t *WriteBehindTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.err != nil {
		return pgconn.CommandTag{}, t.err
	}
	if isExec(sql) {
		return t.queue.writes.Exec(ctx, sql, args...)
	}
	return t.then().Exec(ctx, sql, args...)
}

// Query sends sql after the queued statements.
func (t *WriteBehindTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.err != nil {
		return nil, t.err
	}
	return t.then().Query(ctx, sql, args...)
}

// QueryRow sends sql after the queued statements.
func (t *WriteBehindTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.err != nil {
		return errRow{t.err}
	}
	return t.then().QueryRow(ctx, sql, args...)
}

// SendBatch sends the queued statements first, in a round trip of their
// own.
func (t *WriteBehindTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flushed(ctx); err != nil {
		return errBatch{err}
	}
	return t.Tx.SendBatch(ctx, b)
}

// CopyFrom sends the queued statements first.
func (t *WriteBehindTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flushed(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

// Begin sends the queued statements first: a savepoint's rollback must not
// undo them, nor a failure of theirs be taken for the savepoint's.
func (t *WriteBehindTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flushed(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// flushed is flush, or the failure kept from before.
func (t *WriteBehindTx) flushed(ctx context.Context) error {
	if t.err == nil {
		err := t.flush(ctx)
		if t.err == nil {
			return err // nil, or a failure that was no statement's
		}
	}
	return t.err
}

// errBatch is the results of a batch that was not sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

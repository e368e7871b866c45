package postgres

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pipeline is a sqlc DBTX that queues the statements of :exec and :execrows
// methods and sends them in one round trip: with Send, or ahead of the next
// statement that needs an answer, with Then. It is for writes none of which
// needs the answer of another, such as those at the end of a set-based
// batch. On this project's machine a round trip costs more than a small
// statement.
//
// A queued statement has not run when its method returns: the method
// reports no error and no rows affected. Send reports the first statement
// that failed, and CountInto reports a row count. A check of what a
// statement did belongs on the server (a constraint, a condition that
// fails the statement): a COMMIT sent in the same round trip
// (TxStart.Commit) has run by the time the client could compare.
type Pipeline struct {
	batch pgx.Batch
	into  []*int64 // per statement, where to report its row count, or nil
	after []func(error)
}

// errNeedsRows is the answer to a statement whose rows the caller needs at
// once, which a pipeline cannot give.
var errNeedsRows = errors.New("postgres: a pipeline queues statements without rows only")

// Exec queues the statement.
func (p *Pipeline) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	p.batch.Queue(sql, args...)
	p.into = append(p.into, nil)
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

// CountInto makes Send store in *n the rows the statement queued last
// affected or returned, once it ran: an answer that needs no rows read,
// such as whether a conditional statement did anything.
func (p *Pipeline) CountInto(n *int64) { p.into[len(p.into)-1] = n }

// Len is the number of statements queued; a nil Pipeline has none.
func (p *Pipeline) Len() int {
	if p == nil {
		return 0
	}
	return p.batch.Len()
}

// AfterSend registers f to be called with Send's error once the statements
// have run (e.g. to end their spans).
func (p *Pipeline) AfterSend(f func(error)) { p.after = append(p.after, f) }

// BatchSender is what a Pipeline is sent through: a pgx.Tx, a *pgx.Conn or
// a *pgxpool.Conn.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Send runs the queued statements through db, in order, in one round trip.
// An error names the statement (sqlc's query name) that failed; the ones
// after it did not run, and a transaction they ran in is aborted. Outside a
// transaction they run in one implicit transaction: all or none. A Pipeline
// is sent once.
func (p *Pipeline) Send(ctx context.Context, db BatchSender) (err error) {
	defer func() { p.done(err) }()
	if p.batch.Len() == 0 {
		return nil
	}
	br := db.SendBatch(ctx, &p.batch)
	if err := p.results(br, p.batch.Len()); err != nil {
		return err
	}
	return br.Close()
}

// Then returns a sqlc DBTX for the one statement that follows the queued
// ones and needs an answer (a read, or the next step's first statement): it
// is sent through db after them, in the same round trip, and answers as if
// it ran alone once they all succeeded. If one of them failed, it answers
// with that statement's error, as Send would. The Pipeline is sent with it.
func (p *Pipeline) Then(db BatchSender) DBTX { return then{p: p, db: db} }

// DBTX is what sqlc's methods run their statements on.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// results reads the answers of the first n queued statements from br and
// reports the row counts asked for. On an error it closes br.
func (p *Pipeline) results(br pgx.BatchResults, n int) error {
	for i, q := range p.batch.QueuedQueries[:n] {
		tag, err := br.Exec()
		if err == nil && p.into[i] != nil {
			*p.into[i] = tag.RowsAffected()
		}
		if err != nil {
			_ = br.Close()
			return p.queryError(i, q, err)
		}
	}
	return nil
}

// queryError is the failure err of the statement q, queued at i, which
// reported it. A statement that pgx could not encode or the server could
// not prepare fails the whole round trip before anything is sent, and pgx
// reports it at every statement of it: such an error names its own
// statement by its SQL, which is then the one blamed — its index on p, or
// -1 if it is not queued on p (the statement Then carries, or one sent
// with p by TxStart) or more than once (then it cannot be told which).
func (p *Pipeline) queryError(i int, q *pgx.QueuedQuery, err error) *QueryError {
	var pre pgx.ErrPreprocessingBatch
	if !errors.As(err, &pre) {
		return &QueryError{Query: queryName(q.SQL), Index: i, Err: err}
	}
	i = -1
	for j, qq := range p.batch.QueuedQueries {
		if qq.SQL == pre.SQL() {
			if i >= 0 {
				i = -1 // queued twice: either may be the one
				break
			}
			i = j
		}
	}
	return &QueryError{Query: queryName(pre.SQL()), Index: i, Err: err}
}

func (p *Pipeline) done(err error) {
	if p == nil {
		return
	}
	for _, f := range p.after {
		f(err)
	}
}

// then is the DBTX of Pipeline.Then.
type then struct {
	p  *Pipeline
	db BatchSender
}

// send sends the queued statements and sql, and returns the batch's results
// positioned at sql's answer.
func (t then) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	n := t.p.batch.Len()
	t.p.batch.Queue(sql, args...)
	br := t.db.SendBatch(ctx, &t.p.batch)
	err := t.p.results(br, n)
	t.p.done(err)
	if err != nil {
		return nil, err
	}
	return br, nil
}

func (t then) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := t.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t then) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := t.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{Rows: rows, br: br}, nil
}

func (t then) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := t.send(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// batchRows are the rows of a batch's last statement; closing them closes
// the batch, which hands its connection back. As pgx's Rows, they are
// closed as well when Next returns false: code that reads them to the end
// needs no Close to use the connection again.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close() // a failure shows in the rows' Err
}

// batchRow is the row of a batch's last statement; Scan closes the batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// QueryError is the failure of a statement sent in a Pipeline.
type QueryError struct {
	Query string // sqlc's name of the query, or the start of the statement
	Index int    // its position among the statements queued on the Pipeline
	Err   error
}

func (e *QueryError) Error() string { return e.Query + ": " + e.Err.Error() }
func (e *QueryError) Unwrap() error { return e.Err }

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

package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeginWith returns a transaction of pool that begins with its first
// statement: BEGIN goes to the server in that statement's round trip (pgx's
// Batch.BeginTx), where pool.Begin would wait for BEGIN's answer on its own.
// Statements queued on Ahead go in that round trip too, between BEGIN and
// the statement, and if nothing is sent before Commit, BEGIN, Ahead, the
// writes queued for the end and COMMIT are one round trip.
//
// That is what the inbox needs: its claim queued ahead of the handler's
// first read, so that a batch costs a round trip for the read and one for
// the writes and COMMIT, not one more for the claim. End must be called in
// any case; it hands the connection back.
func BeginWith(pool *pgxpool.Pool) *TxStart { return &TxStart{pool: pool} }

// TxStart is a transaction that begins with its first statement; see
// BeginWith. It holds its connection from that statement until End. It is a
// sqlc DBTX, and Tx is the same transaction as a pgx.Tx. It is not safe for
// concurrent use, as a pgx.Tx is not.
type TxStart struct {
	pool  *pgxpool.Pool
	ahead *Pipeline
	conn  *pgxpool.Conn
	tx    pgx.Tx // once BEGIN succeeded
	err   error  // why it could not begin
}

// Ahead is the pipeline of statements to send ahead of the transaction's
// next statement, in its round trip (after BEGIN, if that statement begins
// the transaction). Its AfterSend functions learn their outcome. If one of
// them fails, the statement that carried them fails with its error and does
// not run.
func (b *TxStart) Ahead() *Pipeline {
	if b.ahead == nil {
		b.ahead = &Pipeline{}
	}
	return b.ahead
}

// SendBatch sends batch in the transaction, after BEGIN if it has not begun
// and after the statements queued on Ahead, in one round trip. The results
// are batch's.
func (b *TxStart) SendBatch(ctx context.Context, batch *pgx.Batch) pgx.BatchResults {
	if b.direct() {
		return b.tx.SendBatch(ctx, batch)
	}
	ahead := b.ahead
	b.ahead = nil
	sent := &pgx.Batch{}
	if b.tx == nil {
		if b.err == nil && b.conn == nil {
			b.conn, b.err = b.pool.Acquire(ctx)
			if b.err != nil {
				b.err = fmt.Errorf("acquire a connection: %w", b.err)
			}
		}
		if b.err != nil {
			ahead.done(b.err)
			return errBatch{b.err}
		}
		sent.BeginTx(pgx.TxOptions{})
	}
	if ahead != nil {
		sent.QueuedQueries = append(sent.QueuedQueries, ahead.batch.QueuedQueries...)
	}
	sent.QueuedQueries = append(sent.QueuedQueries, batch.QueuedQueries...)
	br := b.conn.Conn().SendBatch(ctx, sent)
	if b.tx == nil {
		if _, err := br.Exec(); err != nil { // BEGIN's, or a statement's that could not be sent
			_ = br.Close()
			if qe := (&Pipeline{batch: *sent}).queryError(0, sent.QueuedQueries[0], err); qe.Index != 0 {
				err = qe // named: it is not BEGIN's
			}
			b.err = err // what follows fails with it
			ahead.done(err)
			return errBatch{err}
		}
		b.tx = br.Tx()
	}
	if ahead != nil {
		err := ahead.results(br, ahead.Len())
		ahead.done(err)
		if err != nil {
			return errBatch{err}
		}
	}
	return br
}

// direct reports whether a statement can go straight to the transaction,
// with nothing to send ahead of it.
func (b *TxStart) direct() bool {
	return b.tx != nil && b.ahead.Len() == 0
}

// Exec runs a statement in the transaction; see SendBatch.
func (b *TxStart) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if b.direct() {
		return b.tx.Exec(ctx, sql, args...)
	}
	return (&Pipeline{}).Then(b).Exec(ctx, sql, args...)
}

// Query runs a statement in the transaction; see SendBatch.
func (b *TxStart) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if b.direct() {
		return b.tx.Query(ctx, sql, args...)
	}
	return (&Pipeline{}).Then(b).Query(ctx, sql, args...)
}

// QueryRow runs a statement in the transaction; see SendBatch.
func (b *TxStart) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if b.direct() {
		return b.tx.QueryRow(ctx, sql, args...)
	}
	return (&Pipeline{}).Then(b).QueryRow(ctx, sql, args...)
}

// SendAhead sends BEGIN and the statements queued on Ahead, unless they
// were sent, in a round trip of their own: for a transaction whose queued
// statements must reach the server though nothing else will carry them.
// The error is BEGIN's or a queued statement's, which its AfterSend
// functions learn as well.
func (b *TxStart) SendAhead(ctx context.Context) error {
	_, err := b.begun(ctx)
	return err
}

// begun sends BEGIN and what is queued ahead, unless they were sent, for
// the calls that cannot carry them.
func (b *TxStart) begun(ctx context.Context) (pgx.Tx, error) {
	if !b.direct() {
		if err := b.SendBatch(ctx, &pgx.Batch{}).Close(); err != nil {
			return nil, err
		}
	}
	return b.tx, nil
}

// Tx returns the transaction as a pgx.Tx. Its statements go through b (the
// first begins the transaction), and its Commit is b's Commit without
// writes.
func (b *TxStart) Tx() pgx.Tx { return txStart{b} }

// Commit sends the statements queued on writes (nil for none) and COMMIT,
// in one round trip, with BEGIN and what is queued ahead if they were not
// sent. If one of the queued statements fails, its error is returned as
// Pipeline.Send would return it (and given to the pipeline's AfterSend
// functions): nothing is committed. A failed commit may still have
// happened, when the connection broke after the server committed.
func (b *TxStart) Commit(ctx context.Context, writes *Pipeline) error {
	if writes == nil {
		writes = &Pipeline{}
	}
	tag, err := writes.Then(b).Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		// A statement failed earlier and its error was not returned.
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// End rolls the transaction back unless it was committed, and hands the
// connection back to the pool; one whose state is unknown is closed
// instead. Call it once, whatever happened before.
func (b *TxStart) End(ctx context.Context) {
	if b.conn == nil {
		return
	}
	if b.conn.Conn().PgConn().TxStatus() != 'I' {
		// A failed rollback leaves the transaction open, and Release
		// closes such a connection; the server then rolls it back.
		_, _ = b.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	b.conn.Release()
	b.conn = nil
}

// txStart is a TxStart as a pgx.Tx.
type txStart struct{ b *TxStart }

func (t txStart) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.b.Exec(ctx, sql, args...)
}

func (t txStart) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.b.Query(ctx, sql, args...)
}

func (t txStart) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.b.QueryRow(ctx, sql, args...)
}

func (t txStart) SendBatch(ctx context.Context, batch *pgx.Batch) pgx.BatchResults {
	return t.b.SendBatch(ctx, batch)
}

func (t txStart) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.b.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t txStart) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.b.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, cols, src)
}

func (t txStart) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.b.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// LargeObjects and Conn take no context: they begin the transaction
// without one if nothing has. Conn is nil if it could not begin.
func (t txStart) LargeObjects() pgx.LargeObjects {
	tx, err := t.b.begun(context.Background())
	if err != nil {
		tx = closedTx(err)
	}
	return tx.LargeObjects()
}

func (t txStart) Conn() *pgx.Conn {
	if tx, err := t.b.begun(context.Background()); err == nil {
		return tx.Conn()
	}
	return nil
}

// closedTx is a transaction that could not begin because of err; its
// methods fail with pgx.ErrTxClosed.
func closedTx(err error) pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, err).Tx()
}

func (t txStart) Commit(ctx context.Context) error { return t.b.Commit(ctx, nil) }

// Rollback rolls back what was sent; End still hands the connection back.
func (t txStart) Rollback(ctx context.Context) error {
	if t.b.tx == nil {
		return nil // nothing began
	}
	return t.b.tx.Rollback(ctx)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is the results of a batch that was not sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

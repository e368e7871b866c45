package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeginWith returns the sqlc DBTX of the first statement of a transaction:
// the statement goes to the server in one round trip with its BEGIN (pgx's
// Batch.BeginTx), where pool.Begin would wait for BEGIN's answer on its own.
// That round trip was a quarter of an unbatched inbox event's. Tx then
// returns the transaction, Commit commits it with the writes queued for its
// end in one more round trip, and End, which must be called in any case,
// hands the connection back.
func BeginWith(pool *pgxpool.Pool) *TxStart { return &TxStart{pool: pool} }

// TxStart is a transaction that began with its first statement; see
// BeginWith. It holds its connection from the statement until End.
type TxStart struct {
	pool *pgxpool.Pool
	conn *pgxpool.Conn
	br   pgx.BatchResults
}

// send acquires a connection, queues BEGIN and the statement, sends them,
// and reads BEGIN's answer.
func (b *TxStart) send(ctx context.Context, sql string, args []any) error {
	if b.conn != nil {
		return errors.New("postgres: a TxStart runs one statement")
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	b.conn = conn
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(sql, args...)
	b.br = conn.Conn().SendBatch(ctx, batch)
	_, err = b.br.Exec()
	return err
}

func (b *TxStart) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := b.send(ctx, sql, args); err != nil {
		return nil, err
	}
	return b.br.Query()
}

func (b *TxStart) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := b.send(ctx, sql, args); err != nil {
		return errRow{err}
	}
	return b.br.QueryRow()
}

func (b *TxStart) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := b.send(ctx, sql, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	return b.br.Exec()
}

// Tx finishes the round trip and returns the transaction for the statements
// in between. It is nil when nothing was sent. Commit it with Commit, not
// with its own Commit, which would cost the round trip that Commit saves.
func (b *TxStart) Tx() (pgx.Tx, error) {
	if b.br == nil {
		return nil, errors.New("postgres: a TxStart sent nothing")
	}
	err := b.br.Close()
	return b.br.Tx(), err
}

// Commit sends the statements queued on writes (nil for none) and COMMIT,
// in one round trip. If one of the queued statements fails, its error is
// returned as Pipeline.Send would return it (and given to the pipeline's
// AfterSend functions): nothing is committed. A failed commit may still have
// happened, when the connection broke after the server committed.
func (b *TxStart) Commit(ctx context.Context, writes *Pipeline) error {
	if b.conn == nil {
		return errors.New("postgres: a TxStart sent nothing")
	}
	if writes == nil {
		writes = &Pipeline{}
	}
	tag, err := writes.Then(b.conn).Exec(ctx, "COMMIT")
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
	if b.br != nil {
		_ = b.br.Close() // if Tx was not called
	}
	if b.conn.Conn().PgConn().TxStatus() != 'I' {
		// A failed rollback leaves the transaction open, and Release
		// closes such a connection; the server then rolls it back.
		_, _ = b.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	b.conn.Release()
	b.conn = nil
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

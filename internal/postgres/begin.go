package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeginWith returns the sqlc DBTX of the first statement of a transaction:
// the statement goes to the server in one round trip with its BEGIN (pgx's
// Batch.BeginTx), where pool.Begin would wait for BEGIN's answer on its own.
// That round trip was a quarter of an unbatched inbox event's. Tx then
// returns the transaction, on the connection the pool gave the statement.
func BeginWith(pool *pgxpool.Pool) *TxStart { return &TxStart{pool: pool} }

// TxStart is a transaction's first statement; see BeginWith.
type TxStart struct {
	pool *pgxpool.Pool
	br   pgx.BatchResults
}

// send queues BEGIN and the statement, sends them, and reads BEGIN's answer.
func (b *TxStart) send(ctx context.Context, sql string, args []any) error {
	if b.br != nil {
		return errors.New("postgres: a TxStart runs one statement")
	}
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(sql, args...)
	b.br = b.pool.SendBatch(ctx, batch)
	_, err := b.br.Exec()
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

// Tx finishes the round trip and returns the transaction, to be committed
// or rolled back as usual (a failed one is already closed: its Rollback is
// harmless). It is nil when nothing was sent.
func (b *TxStart) Tx() (pgx.Tx, error) {
	if b.br == nil {
		return nil, errors.New("postgres: a TxStart sent nothing")
	}
	err := b.br.Close()
	return b.br.Tx(), err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// beginWith runs the first statement of a transaction, the claim, in one
// round trip with its BEGIN (pgx's Batch.BeginTx): Pool.Begin waits for
// BEGIN's answer on its own, and that round trip was a quarter of an
// unbatched event's. It is the sqlc DBTX of that one statement; tx then
// returns the transaction it opened, on the connection the pool gave it.
type beginWith struct {
	pool *pgxpool.Pool
	br   pgx.BatchResults
}

// send queues BEGIN and the statement, sends them, and reads BEGIN's answer.
func (b *beginWith) send(ctx context.Context, sql string, args []any) error {
	if b.br != nil {
		return errors.New("inbox: beginWith runs one statement")
	}
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(sql, args...)
	b.br = b.pool.SendBatch(ctx, batch)
	_, err := b.br.Exec()
	return err
}

func (b *beginWith) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := b.send(ctx, sql, args); err != nil {
		return nil, err
	}
	return b.br.Query()
}

func (b *beginWith) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := b.send(ctx, sql, args); err != nil {
		return errRow{err}
	}
	return b.br.QueryRow()
}

func (b *beginWith) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := b.send(ctx, sql, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	return b.br.Exec()
}

// tx finishes the round trip and returns the transaction, to be committed
// or rolled back as usual (a failed one is already closed: its Rollback is
// harmless). It is nil when nothing was sent.
func (b *beginWith) tx() (pgx.Tx, error) {
	if b.br == nil {
		return nil, errors.New("inbox: beginWith sent nothing")
	}
	err := b.br.Close()
	return b.br.Tx(), err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

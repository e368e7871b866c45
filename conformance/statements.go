package conformance

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// watchedTx is the transaction the kit hands a handler when a property
// needs to act inside it: it counts the statements the handler runs on it
// and on its savepoints, and calls stmt before each, which may fail it.
// A batch sent on it (a Pipeline) is one statement; statements a
// set-based handler queues on the inbox's Pipeline are not seen.
type watchedTx struct {
	pgx.Tx
	// stmt is told of the statement about to run on tx (the transaction
	// or a savepoint), numbered from 1 within the handler's call; an error
	// it returns fails the statement.
	stmt func(ctx context.Context, tx pgx.Tx, n int) error
	n    *int
}

func watch(tx pgx.Tx, stmt func(ctx context.Context, tx pgx.Tx, n int) error) *watchedTx {
	return &watchedTx{Tx: tx, stmt: stmt, n: new(int)}
}

func (w *watchedTx) next(ctx context.Context) error {
	*w.n++
	return w.stmt(ctx, w.Tx, *w.n)
}

// Begin opens a savepoint, watched as its transaction is.
func (w *watchedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := w.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &watchedTx{Tx: sp, stmt: w.stmt, n: w.n}, nil
}

func (w *watchedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := w.next(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return w.Tx.Exec(ctx, sql, args...)
}

func (w *watchedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := w.next(ctx); err != nil {
		return errRows{err}, err
	}
	return w.Tx.Query(ctx, sql, args...)
}

func (w *watchedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := w.next(ctx); err != nil {
		return errRows{err}
	}
	return w.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends a batch of statements (a Pipeline sent on tx), counted
// as one statement.
func (w *watchedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := w.next(ctx); err != nil {
		return errBatch{err: err, tx: w}
	}
	return w.Tx.SendBatch(ctx, b)
}

// failStatement makes the server fail a statement of tx as a transient
// failure does: a serialization failure, which aborts the transaction (or
// the savepoint it runs in) as a real one would, and which a retry cures.
func failStatement(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
		MESSAGE = 'conformance: a statement of the handler failed once (an injected serialization failure)'; END $$`)
	if err == nil {
		return errors.New("conformance: the injected statement failure did not fail")
	}
	return err
}

// errRows is the answer to a statement the kit failed.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return pgtype.NewMap() }

// errBatch is the answer to a batch the kit failed.
type errBatch struct {
	err error
	tx  pgx.Tx
}

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return errRows{b.err}, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRows{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return b.tx }

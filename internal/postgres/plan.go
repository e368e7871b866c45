package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PlanEachCall returns tx with its statements planned for the arguments of
// each call, not from the generic plan PostgreSQL caches for a prepared
// statement after five calls.
//
// Set-based statements need it. A generic plan assumes an array parameter
// holds ten elements and keeps the table sizes of the moment it was made:
// a `sku = ANY(@skus)` over a batch's hundred SKUs, planned while the table
// was small, scans and compares every row for every batch until ANALYZE
// invalidates it (four of the nine milliseconds of an inventory batch). A
// plan per call costs a few tens of microseconds, once per batch.
func PlanEachCall(tx pgx.Tx) pgx.Tx { return planEachCall{tx} }

type planEachCall struct{ pgx.Tx }

// mode makes pgx send an unnamed statement, which PostgreSQL plans with the
// values bound to it; the description of the statement stays cached, so a
// call is still one round trip.
func mode(args []any) []any {
	return append([]any{pgx.QueryExecModeCacheDescribe}, args...)
}

func (t planEachCall) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, sql, mode(args)...)
}

func (t planEachCall) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, sql, mode(args)...)
}

func (t planEachCall) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, sql, mode(args)...)
}

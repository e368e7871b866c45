package postgres

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Timeouts bound how long a pool's callers wait on the database, so that a
// flood of requests is refused after a bounded wait instead of piling up.
type Timeouts struct {
	// Statement is every statement's statement_timeout, set on each
	// connection the pool opens (a statement_timeout in the URL wins).
	Statement time.Duration
	// Acquire bounds each wait for a free connection of the pool.
	Acquire time.Duration
}

// WithTimeouts is the Connect option that applies t; a zero field leaves
// its wait unbounded.
func WithTimeouts(t Timeouts) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) {
		if _, set := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !set && t.Statement > 0 {
			cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(t.Statement.Milliseconds(), 10)
		}
		if t.Acquire > 0 {
			cfg.ConnConfig.Tracer = acquireTimeout{next: cfg.ConnConfig.Tracer, timeout: t.Acquire}
		}
	}
}

// acquireTimeout bounds each Acquire of a pool. pgxpool has no such
// setting, but waits for a connection on the context its AcquireTracer
// returns. It passes queries on to the tracer it was set beside.
type acquireTimeout struct {
	next    pgx.QueryTracer
	timeout time.Duration
}

type acquireCancelKey struct{}

func (a acquireTimeout) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	return context.WithValue(ctx, acquireCancelKey{}, cancel)
}

func (a acquireTimeout) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if cancel, ok := ctx.Value(acquireCancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

func (a acquireTimeout) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if a.next == nil {
		return ctx
	}
	return a.next.TraceQueryStart(ctx, conn, data)
}

func (a acquireTimeout) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if a.next != nil {
		a.next.TraceQueryEnd(ctx, conn, data)
	}
}

// IsTimeout reports whether err is a bounded wait of Timeouts that ran out:
// a statement cancelled by its statement_timeout (query_canceled, 57014), or
// a connection not acquired in time (a context deadline). Both are also what
// a cancelled or expired ctx of the caller's own gives, which the caller
// tells apart by its ctx.
func IsTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &pgErr) && pgErr.Code == "57014"
}

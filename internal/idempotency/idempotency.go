package idempotency

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/idempotency/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

var (
	// ErrMismatch means the key was used before with a different request.
	ErrMismatch = errors.New("idempotency key reused with a different request")
	// ErrInFlight means the first request with the key is still running.
	ErrInFlight = errors.New("a request with this idempotency key is in flight")
)

// DefaultRetention is how long keys are kept by default.
const DefaultRetention = 24 * time.Hour

// Request identifies one idempotent request.
type Request struct {
	Scope       string // what the key is scoped to, e.g. "POST /orders"
	Key         string
	Fingerprint []byte // see Fingerprint
}

// Response is what is stored and replayed.
type Response struct {
	Status int
	Header map[string]string
	Body   []byte
}

// Fingerprint hashes the parts of a request that must match on a retry.
func Fingerprint(parts ...[]byte) []byte {
	h := sha256.New()
	for _, p := range parts {
		// Length-prefix each part so that ("ab","c") and ("a","bc") differ.
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return h.Sum(nil)
}

// Store runs idempotent requests against one database.
type Store struct {
	pool         *pgxpool.Pool
	queries      *dbsqlc.Queries
	waitInFlight time.Duration
}

// NewStore returns a store. waitInFlight bounds how long a retry waits for
// the first request with its key before ErrInFlight (default 5s).
func NewStore(pool *pgxpool.Pool, waitInFlight time.Duration) *Store {
	return &Store{pool: pool, queries: dbsqlc.New(), waitInFlight: cmp.Or(waitInFlight, 5*time.Second)}
}

// Func is a request's write, run by Do.
type Func func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (Response, error)

// Do runs fn in a transaction that also claims req's key, and stores fn's
// response with it. When the key was claimed before, fn does not run: Do
// returns the stored response and replayed = true, or ErrMismatch when the
// fingerprints differ, or ErrInFlight when the first request does not finish
// in time. When fn returns an error, nothing is stored.
//
// fn reads and writes through tx, and may queue its last writes on writes:
// they are sent with the stored response and the COMMIT, in one round
// trip, and a failure of any of them fails Do and stores nothing.
func (s *Store) Do(ctx context.Context, req Request, fn Func) (resp Response, replayed bool, err error) {
	begin := postgres.BeginWith(s.pool) // BEGIN goes with the claim
	_, claimErr := s.queries.ClaimKey(ctx, begin, dbsqlc.ClaimKeyParams{
		Scope:       req.Scope,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		LockTimeout: s.lockTimeout(),
	})
	defer begin.End(ctx) // rolls back unless committed
	tx := begin.Tx()
	claimed := !errors.Is(claimErr, pgx.ErrNoRows) // no row: the key was claimed before
	switch {
	case postgres.IsLockNotAvailable(claimErr):
		return Response{}, false, ErrInFlight
	case claimed && claimErr != nil:
		return Response{}, false, fmt.Errorf("claim idempotency key: %w", claimErr)
	case !claimed:
		if resp, err = s.stored(ctx, tx, req); err != nil {
			return Response{}, false, err
		}
		return resp, true, nil
	}
	var writes postgres.Pipeline
	if resp, err = fn(ctx, tx, &writes); err != nil {
		return Response{}, false, err
	}
	// The response is stored in the round trip of fn's writes and the COMMIT.
	if err := s.complete(ctx, &writes, req, resp); err != nil {
		return Response{}, false, err
	}
	if err := begin.Commit(ctx, &writes); err != nil {
		return Response{}, false, fmt.Errorf("write, store idempotent response and commit: %w", err)
	}
	return resp, false, nil
}

// DoWrites is Do with the key's claim sent later: with fn's queued writes,
// the stored response and the COMMIT, on the bet that the key is new. fn
// may read through tx first (its first read carries BEGIN), so a write
// that reads takes two round trips, and one that only queues takes one,
// where Do takes one more for the claim. When the key was claimed before,
// the claim fails, the writes behind it do not run, and DoWrites answers as
// Do: the stored response, ErrMismatch or (after waiting for the request in
// flight with the key) ErrInFlight. When fn returns an error, DoWrites
// looks the key up: a retry whose first request succeeded is replayed even
// when fn refuses now (e.g. with a 503 while the service is overloaded).
//
// fn's reads run before the key is claimed, so a retry runs them again:
// use Do for a write whose reads take locks a retry should not wait for.
func (s *Store) DoWrites(ctx context.Context, req Request, fn Func) (resp Response, replayed bool, err error) {
	resp, fnErr, err := s.claimWithWrites(ctx, req, fn)
	if fnErr != nil {
		// A retry whose first request succeeded is replayed even when
		// fn refuses now.
		stored, serr := s.stored(ctx, s.pool, req)
		switch {
		case serr == nil:
			return stored, true, nil
		case errors.Is(serr, ErrMismatch):
			return Response{}, false, serr
		}
		return Response{}, false, fnErr
	}
	var claimErr *claimError
	switch {
	case err == nil:
		return resp, false, nil
	case !errors.As(err, &claimErr):
		// One of fn's writes failed (or the response's): nothing is stored.
	case postgres.IsLockNotAvailable(err):
		return Response{}, false, ErrInFlight
	case postgres.IsUniqueViolation(err): // claimed before: replay it
		return s.Do(ctx, req, fn)
	}
	return Response{}, false, fmt.Errorf("write, store idempotent response and commit: %w", err)
}

// claimWithWrites runs fn in a transaction, queues the key's claim ahead of
// fn's writes and its response behind them, and commits: fnErr is fn's
// error, err the claim's, the writes' or the commit's. The transaction has
// ended when it returns.
func (s *Store) claimWithWrites(ctx context.Context, req Request, fn Func) (resp Response, fnErr, err error) {
	begin := postgres.BeginWith(s.pool)
	defer begin.End(ctx) // rolls back unless committed
	var writes postgres.Pipeline
	claim := writes.Len() // the claim's index among the queued statements
	// Queued: the error is Commit's.
	_ = s.queries.ClaimNewKey(ctx, &writes, dbsqlc.ClaimNewKeyParams{
		Scope:       req.Scope,
		Key:         req.Key,
		Fingerprint: req.Fingerprint,
		LockTimeout: s.lockTimeout(),
	})
	if resp, fnErr = fn(ctx, begin.Tx(), &writes); fnErr != nil {
		return Response{}, fnErr, nil
	}
	if err := s.complete(ctx, &writes, req, resp); err != nil {
		return Response{}, nil, err
	}
	err = begin.Commit(ctx, &writes)
	if qe, ok := errors.AsType[*postgres.QueryError](err); ok && qe.Index == claim {
		return Response{}, nil, &claimError{err: err}
	}
	return resp, nil, err
}

// claimError is the failure of a key's claim sent with the writes: the key
// was claimed before, or is held by a request in flight.
type claimError struct{ err error }

func (e *claimError) Error() string { return "claim idempotency key: " + e.err.Error() }
func (e *claimError) Unwrap() error { return e.err }

// complete queues on writes the storing of resp under req's key.
func (s *Store) complete(ctx context.Context, writes *postgres.Pipeline, req Request, resp Response) error {
	header, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("encode response header: %w", err)
	}
	if err := s.queries.CompleteKey(ctx, writes, dbsqlc.CompleteKeyParams{
		Scope:           req.Scope,
		Key:             req.Key,
		StatusCode:      pgtype.Int4{Int32: int32(resp.Status), Valid: true},
		ResponseHeaders: header,
		ResponseBody:    resp.Body,
	}); err != nil {
		return fmt.Errorf("store idempotent response: %w", err)
	}
	return nil
}

// lockTimeout is how long a claim waits for a request in flight with its
// key, as PostgreSQL's lock_timeout.
func (s *Store) lockTimeout() string { return fmt.Sprintf("%dms", s.waitInFlight.Milliseconds()) }

func (s *Store) stored(ctx context.Context, db dbsqlc.DBTX, req Request) (Response, error) {
	row, err := s.queries.GetKey(ctx, db, dbsqlc.GetKeyParams{Scope: req.Scope, Key: req.Key})
	if err != nil {
		return Response{}, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(row.Fingerprint) != string(req.Fingerprint) {
		return Response{}, ErrMismatch
	}
	if !row.StatusCode.Valid {
		// Claimed and committed without a response: cannot happen through Do,
		// which stores both in one transaction; treat it as still running.
		return Response{}, ErrInFlight
	}
	resp := Response{Status: int(row.StatusCode.Int32), Body: row.ResponseBody}
	if len(row.ResponseHeaders) > 0 {
		if err := json.Unmarshal(row.ResponseHeaders, &resp.Header); err != nil {
			return Response{}, fmt.Errorf("decode stored response header: %w", err)
		}
	}
	return resp, nil
}

// Cleaner deletes keys older than the retention period.
type Cleaner struct {
	pool      *pgxpool.Pool
	queries   *dbsqlc.Queries
	retention time.Duration
	interval  time.Duration
	logger    *slog.Logger
}

// NewCleaner returns a cleaner; zero durations take DefaultRetention and 10 minutes.
func NewCleaner(pool *pgxpool.Pool, retention, interval time.Duration, logger *slog.Logger) *Cleaner {
	return &Cleaner{
		pool:      pool,
		queries:   dbsqlc.New(),
		retention: cmp.Or(retention, DefaultRetention),
		interval:  cmp.Or(interval, 10*time.Minute),
		logger:    logger,
	}
}

// Clean deletes expired keys and returns how many.
func (c *Cleaner) Clean(ctx context.Context) (int64, error) {
	const batch = 10_000
	var total int64
	for {
		n, err := c.queries.DeleteKeysBefore(ctx, c.pool, dbsqlc.DeleteKeysBeforeParams{
			Before:  time.Now().Add(-c.retention),
			MaxRows: batch,
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("delete expired idempotency keys: %w", err)
		}
		if n < batch {
			return total, nil
		}
	}
}

// Run cleans every interval until ctx is done.
func (c *Cleaner) Run(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if n, err := c.Clean(ctx); err != nil {
				c.logger.WarnContext(ctx, "idempotency cleaner", "err", err)
			} else if n > 0 {
				c.logger.InfoContext(ctx, "idempotency keys expired", "deleted", n)
			}
		}
	}
}

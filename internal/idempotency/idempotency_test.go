package idempotency_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// fixture is a store on a database of its own, with a table for the writes.
type fixture struct {
	store *idempotency.Store
	db    *testenv.Database
}

func newFixture(t *testing.T, wait time.Duration) fixture {
	t.Helper()
	db := testenv.NewServiceDatabase(t, "")
	_, err := db.Pool.Exec(t.Context(), "CREATE TABLE things (key text)")
	require.NoError(t, err)
	return fixture{store: idempotency.NewStore(db.Pool, wait), db: db}
}

// things counts the writes committed.
func (f fixture) things(t *testing.T) (n int) {
	t.Helper()
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM things").Scan(&n))
	return n
}

// way is one of the store's two ways to run a write: Do, which claims the
// key first, and DoWrites, which sends the claim with the writes.
type way func(s *idempotency.Store, ctx context.Context, req idempotency.Request, fn idempotency.Func) (idempotency.Response, bool, error)

var ways = map[string]way{
	"Do":       (*idempotency.Store).Do,
	"DoWrites": (*idempotency.Store).DoWrites,
}

// forEachWay runs test as a parallel subtest for each way.
func forEachWay(t *testing.T, test func(t *testing.T, do way)) {
	for name, do := range ways {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, do)
		})
	}
}

func request(key, body string) idempotency.Request {
	return idempotency.Request{Scope: "POST /things", Key: key, Fingerprint: idempotency.Fingerprint([]byte("POST"), []byte(body))}
}

// insert queues a write of a thing (and, if fail, a statement that fails
// after it) and answers 201.
func insert(fail bool) idempotency.Func {
	return func(ctx context.Context, _ pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
		if _, err := writes.Exec(ctx, "INSERT INTO things VALUES ('k')"); err != nil {
			return idempotency.Response{}, err
		}
		if fail {
			_, _ = writes.Exec(ctx, "SELECT 1/0")
		}
		return idempotency.Response{Status: 201, Header: map[string]string{"X": "y"}, Body: []byte(`{"n":1}`)}, nil
	}
}

func TestReplayMismatchAndFailure(t *testing.T) {
	t.Parallel()
	forEachWay(t, func(t *testing.T, do way) {
		ctx := t.Context()
		f := newFixture(t, 0)

		first, replayed, err := do(f.store, ctx, request("k1", "a"), insert(false))
		require.NoError(t, err)
		require.False(t, replayed)
		again, replayed, err := do(f.store, ctx, request("k1", "a"), insert(false))
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, first, again)
		require.Equal(t, 1, f.things(t), "a replay writes nothing")

		_, _, err = do(f.store, ctx, request("k1", "b"), insert(false))
		require.ErrorIs(t, err, idempotency.ErrMismatch)

		// A failed write stores nothing: the retry runs afresh.
		boom := errors.New("boom")
		_, _, err = do(f.store, ctx, request("k2", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
			return idempotency.Response{}, boom
		})
		require.ErrorIs(t, err, boom)
		_, replayed, err = do(f.store, ctx, request("k2", "a"), insert(false))
		require.NoError(t, err)
		require.False(t, replayed)
		require.Equal(t, 2, f.things(t))
	})
}

// A refusal (an error of the write) of a retry whose first request
// succeeded is not what the client sees: it gets the stored response.
func TestRetryIsReplayedEvenWhenTheWriteWouldRefuse(t *testing.T) {
	t.Parallel()
	forEachWay(t, func(t *testing.T, do way) {
		ctx := t.Context()
		f := newFixture(t, 0)
		first, _, err := do(f.store, ctx, request("k", "a"), insert(false))
		require.NoError(t, err)
		again, replayed, err := do(f.store, ctx, request("k", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("overloaded")
		})
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, first, again)
	})
}

// Writes queued by fn are committed with the stored response; when one of
// them fails, nothing is stored (not even the writes before it) and a retry
// with the key runs afresh.
func TestQueuedWritesCommitWithTheResponse(t *testing.T) {
	t.Parallel()
	forEachWay(t, func(t *testing.T, do way) {
		ctx := t.Context()
		f := newFixture(t, 0)

		_, _, err := do(f.store, ctx, request("k", "a"), insert(true))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22012", pgErr.Code, "division by zero")
		require.Zero(t, f.things(t), "a failed queued write rolls back the writes queued before it")

		_, replayed, err := do(f.store, ctx, request("k", "a"), insert(false))
		require.NoError(t, err)
		require.False(t, replayed, "the failed request stored no response")
		require.Equal(t, 1, f.things(t))

		_, replayed, err = do(f.store, ctx, request("k", "a"), insert(false))
		require.NoError(t, err)
		require.True(t, replayed)
		require.Equal(t, 1, f.things(t), "a replay writes nothing")
	})
}

// Concurrent requests with one key write once; the others replay the
// response. (DoWrites may build the writes of each, but commits one.)
func TestConcurrentRequestsWithOneKeyWriteOnce(t *testing.T) {
	t.Parallel()
	forEachWay(t, func(t *testing.T, do way) {
		f := newFixture(t, 10*time.Second)
		var wg sync.WaitGroup
		replays := atomic.Int32{}
		for range 20 {
			wg.Go(func() {
				_, replayed, err := do(f.store, t.Context(), request("same", "a"), func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
					time.Sleep(50 * time.Millisecond) // let the others arrive
					return insert(false)(ctx, tx, writes)
				})
				require.NoError(t, err)
				if replayed {
					replays.Add(1)
				}
			})
		}
		wg.Wait()
		require.Equal(t, 1, f.things(t))
		require.Equal(t, int32(19), replays.Load())
	})
}

// A retry while the first request holds the key waits for it, and is told
// to come back when the wait is over: no sooner than the store's setting,
// and within a small multiple of it (a unit mix-up, seconds for
// milliseconds, would hold every retry for minutes).
func TestRetryWhileInFlightIsRefusedAfterTheWait(t *testing.T) {
	t.Parallel()
	const wait = 200 * time.Millisecond
	forEachWay(t, func(t *testing.T, do way) {
		ctx := t.Context()
		f := newFixture(t, wait)
		holding, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		t.Cleanup(free) // a failed check must not leave the first request waiting
		done := make(chan error, 1)
		go func() {
			// Do holds the key while its write runs.
			_, _, err := f.store.Do(ctx, request("slow", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
				close(holding)
				<-release
				return idempotency.Response{Status: 201}, nil
			})
			done <- err
		}()
		<-holding
		// A wait far past the bound ends on this deadline instead, with
		// another error than ErrInFlight.
		retryCtx, cancel := context.WithTimeout(ctx, 50*wait)
		defer cancel()
		start := time.Now()
		_, _, err := do(f.store, retryCtx, request("slow", "a"), insert(false))
		waited := time.Since(start)
		require.ErrorIs(t, err, idempotency.ErrInFlight)
		require.GreaterOrEqual(t, waited, wait, "the retry waits for the request in flight")
		require.Less(t, waited, 10*wait, "the retry's wait is bounded by the store's setting")
		free()
		require.NoError(t, <-done)
		require.Zero(t, f.things(t), "a retry in flight must not write")
	})
}

func TestCleanerExpiresOldKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := newFixture(t, 0)
	for _, k := range []string{"old", "new"} {
		_, _, err := f.store.DoWrites(ctx, request(k, "a"), insert(false))
		require.NoError(t, err)
	}
	_, err := f.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days' WHERE key = 'old'`)
	require.NoError(t, err)
	n, err := idempotency.NewCleaner(f.db.Pool, 24*time.Hour, 0, nil).Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, replayed, err := f.store.DoWrites(ctx, request("new", "a"), insert(false))
	require.NoError(t, err)
	require.True(t, replayed, "the recent key is kept")
}

// The parts of a fingerprint are told apart: moving bytes from one part to
// the next makes another request.
func TestFingerprintSeparatesItsParts(t *testing.T) {
	t.Parallel()
	f := idempotency.Fingerprint
	require.Equal(t, f([]byte("POST"), []byte("/a"), []byte("b")), f([]byte("POST"), []byte("/a"), []byte("b")))
	require.NotEqual(t, f([]byte("POST"), []byte("/ab"), []byte("c")), f([]byte("POST"), []byte("/a"), []byte("bc")))
}

// A write that reads takes a round trip for BEGIN and its read, and one for
// its queued writes, the stored response and the COMMIT. Do claims the key
// in a round trip of its own before; DoWrites sends the claim with the
// writes, so a write that reads nothing takes one round trip in all. A
// replay costs Do the claim, the stored response's read and the ROLLBACK;
// DoWrites finds the key taken at the COMMIT's round trip, rolls back and
// goes Do's way.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	readThenInsert := func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM things").Scan(&n); err != nil {
			return idempotency.Response{}, err
		}
		return insert(false)(ctx, tx, writes)
	}
	for _, tc := range []struct {
		name          string
		do            way
		fn            idempotency.Func
		first, replay int64
	}{
		{"Do, reading", (*idempotency.Store).Do, readThenInsert, 3, 3},
		{"DoWrites, reading", (*idempotency.Store).DoWrites, readThenInsert, 2, 6},
		{"DoWrites, reading nothing", (*idempotency.Store).DoWrites, insert(false), 1, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 0)
			pool, trips := f.db.CountingPool(t)
			store := idempotency.NewStore(pool, 0)
			for _, want := range []struct {
				trips    int64
				replayed bool
			}{{tc.first, false}, {tc.replay, true}} {
				trips.Store(0)
				_, replayed, err := tc.do(store, t.Context(), request("k", "a"), tc.fn)
				require.NoError(t, err)
				require.Equal(t, want.replayed, replayed)
				require.Equal(t, want.trips, trips.Load(), "round trips (replayed: %t)", replayed)
			}
			require.Equal(t, 1, f.things(t))
		})
	}
}

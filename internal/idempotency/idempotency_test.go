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

func newStore(t *testing.T, wait time.Duration) (*idempotency.Store, *testenv.Database) {
	t.Helper()
	db := testenv.NewServiceDatabase(t, "")
	return idempotency.NewStore(db.Pool, wait), db
}

func request(key, body string) idempotency.Request {
	return idempotency.Request{Scope: "POST /things", Key: key, Fingerprint: idempotency.Fingerprint([]byte("POST"), []byte(body))}
}

func respond(calls *atomic.Int32, status int) func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
	return func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
		calls.Add(1)
		return idempotency.Response{Status: status, Header: map[string]string{"X": "y"}, Body: []byte(`{"n":1}`)}, nil
	}
}

func TestReplayMismatchAndFailure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, _ := newStore(t, 0)
	var calls atomic.Int32

	first, replayed, err := store.Do(ctx, request("k1", "a"), respond(&calls, 201))
	require.NoError(t, err)
	require.False(t, replayed)
	again, replayed, err := store.Do(ctx, request("k1", "a"), respond(&calls, 201))
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, first, again)
	require.Equal(t, int32(1), calls.Load(), "a replay does not run the write")

	_, _, err = store.Do(ctx, request("k1", "b"), respond(&calls, 201))
	require.ErrorIs(t, err, idempotency.ErrMismatch)

	// A failed write stores nothing: the retry runs afresh.
	boom := errors.New("boom")
	_, _, err = store.Do(ctx, request("k2", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
		return idempotency.Response{}, boom
	})
	require.ErrorIs(t, err, boom)
	_, replayed, err = store.Do(ctx, request("k2", "a"), respond(&calls, 201))
	require.NoError(t, err)
	require.False(t, replayed)
}

// Writes queued by fn are committed with the stored response; when one of
// them fails, nothing is stored (not even the writes before it) and a retry
// with the key runs afresh.
func TestQueuedWritesCommitWithTheResponse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, db := newStore(t, 0)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE things (key text)")
	require.NoError(t, err)
	var calls atomic.Int32
	insert := func(fail bool) idempotency.Func {
		return func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
			if _, err := writes.Exec(ctx, "INSERT INTO things VALUES ('k')"); err != nil {
				return idempotency.Response{}, err
			}
			if fail {
				_, _ = writes.Exec(ctx, "SELECT 1/0")
			}
			return respond(&calls, 201)(ctx, tx, writes)
		}
	}
	things := func() (n int) {
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM things").Scan(&n))
		return n
	}

	_, _, err = store.Do(ctx, request("k", "a"), insert(true))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22012", pgErr.Code, "division by zero")
	require.Zero(t, things(), "a failed queued write rolls back the writes queued before it")

	_, replayed, err := store.Do(ctx, request("k", "a"), insert(false))
	require.NoError(t, err)
	require.False(t, replayed, "the failed request stored no response")
	require.Equal(t, 1, things())

	_, replayed, err = store.Do(ctx, request("k", "a"), insert(false))
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, 1, things(), "a replay writes nothing")
}

func TestConcurrentRequestsWithOneKeyRunOnce(t *testing.T) {
	t.Parallel()
	store, _ := newStore(t, 10*time.Second)
	var calls atomic.Int32
	var wg sync.WaitGroup
	replays := atomic.Int32{}
	for range 20 {
		wg.Go(func() {
			_, replayed, err := store.Do(t.Context(), request("same", "a"), func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
				time.Sleep(50 * time.Millisecond) // hold the key while the others arrive
				return respond(&calls, 201)(ctx, tx, writes)
			})
			require.NoError(t, err)
			if replayed {
				replays.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, int32(19), replays.Load())
}

func TestRetryWhileInFlightIsRefusedAfterTheWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, _ := newStore(t, 100*time.Millisecond)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, _, err := store.Do(ctx, request("slow", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
			close(holding)
			<-release
			return idempotency.Response{Status: 201}, nil
		})
		done <- err
	}()
	<-holding
	_, _, err := store.Do(ctx, request("slow", "a"), func(context.Context, pgx.Tx, *postgres.Pipeline) (idempotency.Response, error) {
		t.Error("a retry in flight must not run the write")
		return idempotency.Response{}, nil
	})
	require.ErrorIs(t, err, idempotency.ErrInFlight)
	close(release)
	require.NoError(t, <-done)
}

func TestCleanerExpiresOldKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, db := newStore(t, 0)
	var calls atomic.Int32
	for _, k := range []string{"old", "new"} {
		_, _, err := store.Do(ctx, request(k, "a"), respond(&calls, 201))
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '2 days' WHERE key = 'old'`)
	require.NoError(t, err)
	n, err := idempotency.NewCleaner(db.Pool, 24*time.Hour, 0, nil).Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, replayed, err := store.Do(ctx, request("new", "a"), respond(&calls, 201))
	require.NoError(t, err)
	require.True(t, replayed, "the recent key is kept")
}

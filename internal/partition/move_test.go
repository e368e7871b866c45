package partition_test

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

const (
	waitingRows = 200_000
	// maxWriterLockWait bounds the longest a writer's statement waits for
	// a lock while the maintenance moves rows out of DEFAULT (issue 47), on
	// a machine that moves them at its usual pace; see lockWaitBound.
	maxWriterLockWait = 100 * time.Millisecond
	// roundShare is how much of the round a writer's lock wait may take on
	// a machine so loaded that the round is slow: a lock held for a catalog
	// change takes a small share of a round that moves 200,000 rows (some
	// 2 % on a quiet machine, 5.3 % seen in a CI run beside the other
	// packages), a lock held while rows move takes most of it (80 % when
	// partition_create moved them all under its lock).
	roundShare = 4
	writerApp  = "partition-test-writer"
)

// waitingID is the id of the i-th row the test puts in DEFAULT, as the SQL
// that puts it there computes it: md5('w' || i)::uuid.
func waitingID(i int) uuid.UUID {
	return uuid.UUID(md5.Sum([]byte("w" + itoa(i))))
}

func itoa(i int) string { return strconv.Itoa(i) }

// 200,000 claims waiting in processed_events_default for an hour whose
// partition does not exist (a maintenance that fell hours behind) are moved
// into it while writers claim: new events elsewhere, new events of that
// hour, and duplicates of the waiting ones. No writer's statement waits for
// a lock behind a statement that moves rows, nor longer than
// lockWaitBound (pg_locks, sampled), no duplicate is claimed twice, and
// every row is in its partition once.
func TestDefaultRowsMoveWithoutHoldingWriters(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	in := partition.InboxTable(time.Hour, 168*time.Hour, 5*time.Minute)
	clock := now
	steps := &stepTimes{}
	m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{in}, Observer: steps, Now: func() time.Time { return clock }}, e.logger)
	_, err := m.Maintain(ctx, in)
	require.NoError(t, err)

	hour := now.Truncate(time.Hour).Add(9 * time.Hour) // past the partitions made
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
		SELECT 'c', md5('w' || i)::uuid, 't', $1::timestamptz + i * interval '10 ms', i, $1::timestamptz + i * interval '10 ms'
		FROM generate_series(1, $2::integer) AS i`, hour, waitingRows)
	require.NoError(t, err)
	require.Equal(t, waitingRows, e.count(t, `SELECT count(*) FROM processed_events_default`))

	w := startWriters(t, e, hour, clock.Add(2*time.Hour))
	sampled := sampleLockWaits(t, e, writerApp)
	w.awaitClaims(t, 20) // the writers are under way before the round
	clock = hour.Add(10 * time.Minute)
	began := time.Now()
	res, err := m.Maintain(ctx, in)
	round := time.Since(began)
	require.NoError(t, err)
	require.Positive(t, res.Created)
	w.awaitClaims(t, w.claims.Load()+20) // and after it
	w.stop()
	waits := sampled()

	t.Logf("the round: %s; its steps: %s", round.Round(time.Millisecond), steps)
	t.Logf("longest lock wait of a writer: %s (sampled from pg_locks), behind %q; waits behind a move: %d; longest writer statement: %s; refusals: %d; claims: %d",
		waits.longest, waits.behind, waits.behindMove, time.Duration(w.longest.Load()), w.refused.Load(), w.claims.Load())
	require.Zero(t, waits.behindMove, "writers waited for a lock held while rows moved, e.g. behind %q", waits.moving)
	require.Less(t, waits.longest, lockWaitBound(round))
	require.Zero(t, w.doubles.Load(), "duplicates claimed a second time")
	require.Zero(t, e.count(t, `SELECT count(*) FROM processed_events_default`))
	require.Equal(t, waitingRows, e.count(t, `SELECT count(*) FROM processed_events WHERE consumer = 'c'`))
	require.Equal(t, waitingRows+int(w.claims.Load()), e.count(t, `SELECT count(*) FROM processed_events`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT 1 FROM processed_events GROUP BY event_id, consumer HAVING count(*) > 1) AS d`))
	require.Equal(t, waitingRows, e.count(t, `SELECT count(*) FROM processed_events WHERE consumer = 'c' AND tableoid = to_regclass($1)`,
		"processed_events_p"+hour.UTC().Format("20060102_150405")))
}

// writers claim events as the inbox does, each on its own connection of a
// pool whose sessions are named writerApp, until stop.
type writers struct {
	claims, refused, doubles, longest atomic.Int64
	stop                              func()
}

func startWriters(t *testing.T, e *env, hour, elsewhere time.Time) *writers {
	t.Helper()
	pool := e.namedPool(t, writerApp, 4)
	w := &writers{}
	var stopping atomic.Bool
	var wg sync.WaitGroup
	for n := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stopping.Load(); i++ {
				w.claim(t, pool, n, i, hour, elsewhere)
			}
		}()
	}
	// Each writer finishes its claim, so that the claims counted are the
	// claims made.
	w.stop = func() { stopping.Store(true); wg.Wait() }
	t.Cleanup(w.stop)
	return w
}

// claim makes one claim, again while it is refused: writer n's i-th of a
// new event elsewhere, of a new event of hour, or of a duplicate of a row
// waiting in DEFAULT.
func (w *writers) claim(t *testing.T, pool *pgxpool.Pool, n, i int, hour, elsewhere time.Time) {
	id, at, duplicate := uuid.New(), elsewhere.Add(time.Duration(i)*time.Millisecond), false
	switch i % 3 {
	case 1:
		at = hour.Add(time.Duration(rand.IntN(int(time.Hour/time.Millisecond))) * time.Millisecond)
	case 2:
		k := 1 + rand.IntN(waitingRows)
		id, at, duplicate = waitingID(k), hour.Add(time.Duration(k)*10*time.Millisecond), true
	}
	consumer := "c"
	if !duplicate {
		consumer = "w" + itoa(n)
	}
	for {
		start := time.Now()
		rows, err := pool.Query(context.Background(), `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
			VALUES ($1, $2, 't', $3, 0, $3) ON CONFLICT DO NOTHING RETURNING event_id`, consumer, id, at)
		var claimed int
		if err == nil {
			for rows.Next() {
				claimed++
			}
			rows.Close()
			err = rows.Err()
		}
		d := int64(time.Since(start))
		for old := w.longest.Load(); d > old && !w.longest.CompareAndSwap(old, d); old = w.longest.Load() {
		}
		var pgErr *pgconn.PgError
		switch {
		case err == nil && duplicate && claimed > 0:
			w.doubles.Add(1)
		case err == nil && !duplicate:
			w.claims.Add(int64(claimed))
		case errors.As(err, &pgErr) && pgErr.Code == "23514": // refused while its range moves
			w.refused.Add(1)
			continue
		case err != nil:
			t.Errorf("claim %s: %v", id, err)
		}
		return
	}
}

func (w *writers) awaitClaims(t *testing.T, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return w.claims.Load() >= n }, waitFor, tick)
}

// lockWaitBound is the longest a writer may wait for a lock during a round
// that took round: maxWriterLockWait, or on a machine so loaded that the
// round itself is slow, a roundShare-th of it. A wait as PostgreSQL reports
// it grows with the CPU its lock's holder is denied; a wait for a lock held
// while rows move grows with the rows, and takes most of the round however
// fast the machine.
func lockWaitBound(round time.Duration) time.Duration {
	return max(maxWriterLockWait, round/roundShare)
}

// lockWaits is what sampleLockWaits saw of the waits of a session: the
// longest, and the statement of the session it waited behind; and how many
// times it was seen waiting behind a statement that moves rows between
// partitions (partition_move_batch, partition_clean_default), with one of
// them.
type lockWaits struct {
	longest    time.Duration
	behind     string
	behindMove int
	moving     string
}

// sampleLockWaits samples pg_locks until the returned function is called,
// which returns the waits for a lock of the sessions named app: for how
// long each has waited (pg_locks.waitstart) and behind which session's
// statement (pg_blocking_pids).
func sampleLockWaits(t *testing.T, e *env, app string) func() lockWaits {
	t.Helper()
	conn, err := e.db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var seen lockWaits
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Release()
		for ctx.Err() == nil {
			rows, err := conn.Query(ctx, `SELECT (extract(epoch FROM clock_timestamp() - l.waitstart) * 1e6)::bigint, coalesce(b.query, '')
				FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				LEFT JOIN pg_stat_activity b ON b.pid = ANY (pg_blocking_pids(l.pid))
				WHERE NOT l.granted AND l.waitstart IS NOT NULL AND a.application_name = $1`, app)
			if err == nil {
				var us int64
				var behind string
				_, err = pgx.ForEachRow(rows, []any{&us, &behind}, func() error {
					seen.add(time.Duration(us)*time.Microsecond, behind)
					return nil
				})
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("sample pg_locks: %v", err)
				return
			}
		}
	}()
	stop := func() lockWaits { cancel(); <-done; return seen }
	t.Cleanup(func() { stop() })
	return stop
}

func (s *lockWaits) add(d time.Duration, behind string) {
	if strings.Contains(behind, "partition_move_batch") || strings.Contains(behind, "partition_clean_default") {
		s.behindMove++
		s.moving = behind
	}
	if d > s.longest {
		s.longest, s.behind = d, behind
	}
}

// stepTimes is an Observer that counts the steps of each kind and keeps the
// longest, for the test's log.
type stepTimes struct {
	mu      sync.Mutex
	n       map[string]int
	longest map[string]time.Duration
}

func (s *stepTimes) Step(_, op string, d time.Duration, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n, s.longest = map[string]int{}, map[string]time.Duration{}
	}
	s.n[op]++
	s.longest[op] = max(s.longest[op], d)
}

func (s *stepTimes) Partitions(string, int, time.Time) {}
func (s *stepTimes) Maintained(string, time.Time)      {}
func (s *stepTimes) Unmoved(string, int)               {}

func (s *stepTimes) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for op, n := range s.n {
		fmt.Fprintf(&b, "%s: %d, longest %s; ", op, n, s.longest[op].Round(time.Millisecond))
	}
	return b.String()
}

// The sampling of lock waits sees a writer that waits: one kept from
// processed_events for longer than maxWriterLockWait is reported so.
func TestLockWaitSamplingSeesAWait(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	w := startWriters(t, e, time.Now().Add(time.Hour), time.Now())
	w.awaitClaims(t, 1)
	sampled := sampleLockWaits(t, e, writerApp)
	lock := testenv.Begin(t, e.db.Pool)
	_, err := lock.Exec(t.Context(), `LOCK TABLE processed_events IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	e.awaitLockWaits(t, 4)
	held := time.Now()
	require.Eventually(t, func() bool { return time.Since(held) > maxWriterLockWait }, waitFor, tick)
	require.NoError(t, lock.Rollback(t.Context()))
	w.stop()
	waits := sampled()
	require.GreaterOrEqual(t, waits.longest, maxWriterLockWait)
	require.Contains(t, waits.behind, "LOCK TABLE processed_events")
}

// namedPool is a pool of e's database of at most n sessions, named app.
func (e *env) namedPool(t *testing.T, app string, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

package partition_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// recorder is an Observer that keeps the last state and success per table.
type recorder struct {
	mu         sync.Mutex
	partitions map[string]int
	until      map[string]time.Time
	maintained map[string]time.Time
	unmoved    map[string]int
}

func newRecorder() *recorder {
	return &recorder{partitions: map[string]int{}, until: map[string]time.Time{}, maintained: map[string]time.Time{}, unmoved: map[string]int{}}
}

func (r *recorder) Step(string, string, time.Duration, error) {}

func (r *recorder) Partitions(table string, n int, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partitions[table], r.until[table] = n, until
}

func (r *recorder) Maintained(table string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maintained[table] = at
}

func (r *recorder) Unmoved(table string, rows int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unmoved[table] = rows
}

// A round tells how many partitions there are and how far they reach, also
// when it fails (a maintenance that stalls shows as a reach that stops
// moving), and when it last succeeded, only when it did.
func TestARoundReportsThePartitionsEvenWhenItFails(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	rec := newRecorder()
	out := partition.OutboxTable(10*time.Minute, time.Hour)
	m := partition.New(e.db.Pool, partition.Config{
		Tables: []partition.Table{out}, LockTimeout: 50 * time.Millisecond, Attempts: 1, Observer: rec,
		Now: func() time.Time { return now },
	}, e.logger)
	res, err := m.Maintain(ctx, out)
	require.NoError(t, err)
	require.Equal(t, now, rec.maintained["outbox"])
	require.Equal(t, res.Partitions, rec.partitions["outbox"])
	require.Equal(t, e.count(t, `SELECT count(*) FROM partitions_of('outbox')`), res.Partitions)
	require.False(t, res.Until.Before(now.Add(out.Reach())))
	require.True(t, rec.until["outbox"].Equal(res.Until))

	// A reader of the outbox keeps the creates out; the round fails after
	// it made none, and says so.
	reader := testenv.Begin(t, e.db.Pool)
	_, err = reader.Exec(ctx, `SELECT count(*) FROM outbox`)
	require.NoError(t, err)
	first := now
	now = now.Add(time.Hour)
	failed, err := m.Maintain(ctx, out)
	require.ErrorContains(t, err, "lock")
	require.Equal(t, first, rec.maintained["outbox"], "no success since")
	require.Equal(t, res.Partitions, failed.Partitions)
	require.Equal(t, failed.Partitions, rec.partitions["outbox"])
	require.True(t, rec.until["outbox"].Equal(res.Until), "the reach as it is")
}

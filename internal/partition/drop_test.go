package partition_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
)

const (
	sentRows    = 300_000
	producerApp = "partition-test-producer"
)

// Dropping an outbox partition of 300,000 sent rows keeps producers, who
// write the outbox meanwhile, waiting for a lock less than lockWaitBound
// (pg_locks, sampled): the check that every row is sent,
// made again under the table's lock, reads the relay's position and index
// ranges, not the partition's rows (outbox_all_sent, 00013). The review
// measured 0.69 s at load 6 when it re-read every row under the lock.
func TestOutboxDropHoldsProducersBriefly(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	// The present's partitions, where producers write, and nothing dropped.
	keep := partition.OutboxTable(time.Hour, 24*time.Hour)
	_, err := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{keep}}, e.logger).Maintain(ctx, keep)
	require.NoError(t, err)
	// 300,000 rows of three hours ago, in the migration's partition
	// outbox_legacy, sent an hour ago.
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, created_at)
		SELECT gen_random_uuid(), 't', 's', 'order-' || n, 'orders.placed.v1', now(), '{}', now() - interval '3 hours'
		FROM generate_series(1, $1::integer) AS n`, sentRows)
	require.NoError(t, err)
	// The relay's one position, which covers them; the migration's, stamped
	// within the retention, would make a later one count from it.
	_, err = e.db.Pool.Exec(ctx, `DELETE FROM outbox_batch`)
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO outbox_batch (recorded_at, snap, upto, span_snap, span_upto, span_done, epoch, system_id)
		SELECT now() - interval '1 hour', pg_current_snapshot(), u, pg_current_snapshot(), u, u,
		       (SELECT coalesce(max(id), 0) FROM outbox_redrive), outbox_system_id()
		FROM (SELECT max(id) AS u FROM outbox) AS p`)
	require.NoError(t, err)
	require.Equal(t, sentRows, e.count(t, `SELECT count(*) FROM outbox_legacy`))

	var produced atomic.Int64
	stop := startProducers(t, e, &produced)
	sampled := sampleLockWaits(t, e, producerApp)
	require.Eventually(t, func() bool { return produced.Load() >= 20 }, waitFor, tick)
	steps := &stepTimes{}
	out := partition.OutboxTable(time.Hour, time.Minute)
	m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{out}, Observer: steps,
		Now: func() time.Time { return time.Now().Add(time.Minute) }}, e.logger)
	began := time.Now()
	res, err := m.Maintain(ctx, out)
	round := time.Since(began)
	require.NoError(t, err)
	from := produced.Load()
	require.Eventually(t, func() bool { return produced.Load() >= from+20 }, waitFor, tick)
	stop()
	waits := sampled()

	t.Logf("the round: %s; its steps: %s; longest lock wait of a producer: %s (sampled from pg_locks), behind %q; rows produced: %d",
		round.Round(time.Millisecond), steps, waits.longest, waits.behind, produced.Load())
	require.Positive(t, res.Dropped)
	require.False(t, e.exists(t, "outbox_legacy"))
	require.Less(t, waits.longest, lockWaitBound(round))
	require.Equal(t, int(produced.Load()), e.count(t, `SELECT count(*) FROM outbox`))
}

// startProducers writes outbox rows, one a transaction, from four sessions
// named producerApp, counting them in produced, until the returned
// function is called.
func startProducers(t *testing.T, e *env, produced *atomic.Int64) func() {
	t.Helper()
	pool := e.namedPool(t, producerApp, 4)
	var stopping atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopping.Load() {
				_, err := pool.Exec(context.Background(), `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
					VALUES (gen_random_uuid(), 't', 's', 'order-p', 'orders.placed.v1', now(), '{}')`)
				if err != nil {
					t.Errorf("produce: %v", err)
					return
				}
				produced.Add(1)
			}
		}()
	}
	stop := func() { stopping.Store(true); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

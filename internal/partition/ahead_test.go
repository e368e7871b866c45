package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// Partitions are made hours ahead of the clock, their number bounded: the
// inbox's hourly partitions six hours past the skew, the outbox's
// 10-minute ones two hours (twelve partitions). A long reader of the
// outbox keeps every create out (each locks the DEFAULT partition) for as
// long as it reads; rows written an hour and a half on still find their
// partition, not the DEFAULT one.
func TestPartitionsReachHoursAheadWithinABound(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	in := partition.InboxTable(time.Hour, 168*time.Hour, 5*time.Minute)
	out := partition.OutboxTable(10*time.Minute, time.Hour)
	require.Equal(t, 6*time.Hour+5*time.Minute, in.Reach())
	require.Equal(t, 2*time.Hour, out.Reach())
	clock := now
	m := partition.New(e.db.Pool, partition.Config{
		Tables: []partition.Table{in, out}, LockTimeout: 50 * time.Millisecond, Attempts: 1,
		Now: func() time.Time { return clock },
	}, e.logger)
	for _, table := range []partition.Table{in, out} {
		_, err := m.Maintain(ctx, table)
		require.NoError(t, err)
		var reach time.Time
		var ahead int
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT max(hi), count(*) FILTER (WHERE lo > $2)
			FROM partitions_of($1) WHERE NOT is_default`, table.Name, now).Scan(&reach, &ahead))
		require.False(t, reach.Before(now.Add(table.Reach())), "%s reaches %s", table.Name, reach.Sub(now))
		require.Less(t, reach.Sub(now), table.Reach()+table.Interval, table.Name)
		require.LessOrEqual(t, ahead, partition.MaxPartitionsAhead+1, table.Name)
	}

	reader := testenv.Begin(t, e.db.Pool)
	_, err := reader.Exec(ctx, `SELECT count(*) FROM outbox`)
	require.NoError(t, err)
	clock = now.Add(90 * time.Minute)
	_, err = m.Maintain(ctx, out)
	require.ErrorContains(t, err, "lock", "the reader keeps the create out")
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, created_at)
		VALUES (gen_random_uuid(), 't', 's', 'order-1', 'orders.placed.v1', now(), '{}', $1)`, clock)
	require.NoError(t, err)
	require.NoError(t, reader.Rollback(context.WithoutCancel(ctx)))
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_default`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM outbox`))
}

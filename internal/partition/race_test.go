package partition_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// Two replicas whose rounds drop the same outbox partition at the same
// time both succeed, and the partition goes once. Each drop reads the
// outbox before it locks it out (outbox_all_sent); a session that holds
// the partition keeps both drops waiting in that read until both are
// there, so that, without a lock that lets one maintainer in at a time,
// each would then wait for the other's read to lock the table: a
// deadlock, one round failing.
func TestTwoReplicasDropTheSamePartitionAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	out := partition.OutboxTable(time.Hour, time.Minute)
	_, err := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{out}}, e.logger).Maintain(ctx, out)
	require.NoError(t, err)
	require.True(t, e.exists(t, "outbox_legacy"))

	hold := testenv.Begin(t, e.db.Pool)
	_, err = hold.Exec(ctx, `LOCK TABLE outbox_legacy IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	later := func() time.Time { return time.Now().Add(time.Minute) } // outbox_legacy is past the retention
	errs := make([]error, 2)
	results := make([]partition.Result, 2)
	var wg sync.WaitGroup
	for r, app := range []string{"partition-test-replica-a", "partition-test-replica-b"} {
		m := partition.New(e.namedPool(t, app, 2), partition.Config{
			Tables: []partition.Table{out}, LockTimeout: waitFor, Attempts: 1, Now: later,
		}, e.logger)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r], errs[r] = m.Maintain(ctx, out)
		}()
	}
	e.awaitLockWaits(t, 2)
	require.NoError(t, hold.Rollback(ctx))
	wg.Wait()

	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, 1, results[0].Dropped+results[1].Dropped)
	require.False(t, e.exists(t, "outbox_legacy"))
}

package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// An event redelivered after the boundary of the partition it was first
// processed in is still a duplicate: its claim goes to the partition of its
// id's time, not of the time it comes. Once that partition is dropped, the
// retention guard refuses the event: it is dead-lettered, with no effect.
func TestRedeliveryAcrossPartitionsIsADuplicateAndPastTheirDropRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.withNATS(t)
	now := time.Now()
	m, in, _ := e.maintainer(time.Hour, time.Hour, func() time.Time { return now })
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)

	// Minted three seconds ago: its one-second partition is behind the
	// clock already, and later partitions exist.
	ev := eventMintedAt(t, now.Add(-3*time.Second))
	c, stop := e.consume(t, time.Hour)
	e.publish(t, ev)
	awaitStats(t, c, inbox.Stats{Processed: 1})
	first := e.partitionOf(t, ev.ID)
	require.NotEqual(t, "processed_events_default", first)

	now = time.Now().Add(2 * time.Second) // boundaries later
	res, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.Positive(t, res.Created)
	e.publish(t, ev)
	awaitStats(t, c, inbox.Stats{Processed: 1, Duplicates: 1})
	require.Equal(t, first, e.partitionOf(t, ev.ID))
	stop()

	// A retention of two seconds, which the event, three seconds old, is
	// past; the maintenance an hour on: every partition so far goes, the
	// event's with it.
	const retention = 2 * time.Second
	m, in, _ = e.maintainer(retention, time.Hour, func() time.Time { return now.Add(time.Hour) })
	res, err = m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.Positive(t, res.Dropped)
	require.False(t, e.exists(t, first), "partition %s kept", first)

	c, _ = e.consume(t, retention)
	e.publish(t, ev)
	// Refused by the retention guard, not by anything else.
	e.requireDeadLettered(t, c, ev, "beyond the inbox retention")
}

// An event from a producer whose clock is fast is processed, never
// dead-lettered: a replica six minutes ahead (beyond INBOX_MAX_SKEW) has its
// claim in its partition, one thirty hours ahead in the DEFAULT partition,
// moved into its own when the maintenance makes it; both still answer a
// redelivery. Only an event dated further ahead than the retention, which
// no clock explains, is dead-lettered.
func TestEventsFromAFastClockAreProcessed(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.withNATS(t)
	// Hour-long partitions made 5m and two intervals ahead, as the
	// services make them (INBOX_PARTITION_INTERVAL, INBOX_MAX_SKEW).
	in := partition.InboxTable(time.Hour, 48*time.Hour, 5*time.Minute)
	maintain := func(now func() time.Time) {
		m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{in}, Now: now}, e.logger)
		_, err := m.Maintain(t.Context(), in)
		require.NoError(t, err)
	}
	maintain(time.Now)
	c, _ := e.consume(t, 48*time.Hour)
	fast := eventMintedAt(t, time.Now().Add(6*time.Minute))
	far := eventMintedAt(t, time.Now().Add(30*time.Hour))
	absurd := eventMintedAt(t, time.Now().Add(49*time.Hour))
	e.publish(t, fast)
	e.publish(t, far)
	e.publish(t, absurd)
	awaitStats(t, c, inbox.Stats{Processed: 2, DeadLettered: 1})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, fast.ID))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, far.ID))
	require.Zero(t, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, absurd.ID))
	require.NotEqual(t, "processed_events_default", e.partitionOf(t, fast.ID))
	require.Equal(t, "processed_events_default", e.partitionOf(t, far.ID))

	// The maintenance, thirty hours on, makes far's partition and moves its
	// claim there.
	maintain(func() time.Time { return time.Now().Add(30 * time.Hour) })
	require.NotEqual(t, "processed_events_default", e.partitionOf(t, far.ID))

	e.publish(t, fast)
	e.publish(t, far)
	awaitStats(t, c, inbox.Stats{Processed: 2, Duplicates: 2, DeadLettered: 1})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, far.ID))
}

// Claims made before their partition existed wait in the DEFAULT partition
// and move into it when the maintenance makes it, where they still answer
// a redelivery.
func TestRowsInTheDefaultPartitionMoveIntoTheirs(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.withNATS(t)
	c, _ := e.consume(t, time.Hour)
	ev := eventMintedAt(t, time.Now())
	e.publish(t, ev)
	awaitStats(t, c, inbox.Stats{Processed: 1})
	require.Equal(t, "processed_events_default", e.partitionOf(t, ev.ID))

	m, in, _ := e.maintainer(time.Hour, time.Hour, time.Now)
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.NotEqual(t, "processed_events_default", e.partitionOf(t, ev.ID))
	require.Zero(t, e.count(t, `SELECT count(*) FROM processed_events_default`))

	e.publish(t, ev)
	awaitStats(t, c, inbox.Stats{Processed: 1, Duplicates: 1})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID))
}

// An outbox partition past the retention goes only once every row in it
// was sent longer than the retention ago.
func TestOutboxPartitionsGoOnlyWhenSentPastTheRetention(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	now := time.Now()
	m, _, out := e.maintainer(time.Hour, time.Minute, func() time.Time { return now })
	_, err := m.Maintain(t.Context(), out)
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(t.Context(), `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 's', 'order-' || n, 'orders.placed.v1', now(), '{}' FROM generate_series(1, 3) AS n`)
	require.NoError(t, err)
	var part string
	require.NoError(t, e.db.Pool.QueryRow(t.Context(), `SELECT DISTINCT tableoid::regclass::text FROM outbox`).Scan(&part))
	require.NotEqual(t, "outbox_default", part)

	later := func() time.Time { return now.Add(time.Hour) }
	m, _, out = e.maintainer(time.Hour, time.Minute, later)
	maintain := func() partition.Result {
		res, err := m.Maintain(t.Context(), out)
		require.NoError(t, err)
		return res
	}
	require.Positive(t, maintain().Kept, "unsent rows")
	require.True(t, e.exists(t, part))

	exec := func(sql string) {
		_, err := e.db.Pool.Exec(t.Context(), sql)
		require.NoError(t, err)
	}
	// A position of the relay, recorded ago, that covers the rows up to upto
	// (a subquery), as the relay records it after their acks.
	record := func(ago, upto string) {
		exec(`INSERT INTO outbox_batch (recorded_at, snap, upto, span_snap, span_upto, span_done, epoch, system_id)
			SELECT now() - interval '` + ago + `', pg_current_snapshot(), u, pg_current_snapshot(), u, u,
			       (SELECT coalesce(max(id), 0) FROM outbox_redrive), outbox_system_id()
			FROM (SELECT ` + upto + ` AS u) AS p`)
	}
	record("2 minutes", `(SELECT max(id) - 1 FROM outbox)`)
	require.Positive(t, maintain().Kept, "an unsent row")
	record("0", `(SELECT max(id) FROM outbox)`)
	require.Positive(t, maintain().Kept, "a row sent within the retention")
	require.True(t, e.exists(t, part))

	// The same rows all sent two minutes ago, then a redrive to before.
	exec(`DELETE FROM outbox_batch`)
	record("2 minutes", `(SELECT max(id) FROM outbox)`)
	_, err = outbox.Redrive(t.Context(), e.db.Pool, time.Now().Add(-5*time.Minute))
	require.NoError(t, err)
	require.Positive(t, maintain().Kept, "rows a redrive made unsent")
	record("2 minutes", `(SELECT max(id) FROM outbox)`) // sent again
	require.Positive(t, maintain().Dropped)
	require.False(t, e.exists(t, part))
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox`))
}

// A partition drop refuses to run its check under a snapshot older than its
// lock: under REPEATABLE READ the check would not see what committed while
// it waited (a redrive).
func TestAnOutboxDropRefusesRepeatableRead(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tx, err := e.db.Pool.BeginTx(t.Context(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(t.Context()) }()
	_, err = tx.Exec(t.Context(), `SELECT partition_drop('outbox', 'outbox_default', '1s', now())`)
	require.ErrorContains(t, err, "needs READ COMMITTED")
}

// A step waits for its lock no longer than the lock timeout: a transaction
// that holds the table keeps the drop out (retried, then reported), and the
// drop goes once it ended.
func TestADropWaitsNoLongerThanTheLockTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	now := time.Now()
	m, in, _ := e.maintainer(time.Second, time.Hour, func() time.Time { return now })
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)

	tx := testenv.Begin(t, e.db.Pool)
	_, err = tx.Exec(t.Context(), `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
		VALUES ('c', gen_random_uuid(), 't', now(), 1, now())`)
	require.NoError(t, err)

	now = now.Add(time.Hour)
	start := time.Now()
	_, err = m.Maintain(t.Context(), in)
	require.ErrorContains(t, err, "lock")
	// Two attempts of 50ms and a pause: far less than the transaction.
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, tx.Commit(context.WithoutCancel(t.Context())))

	res, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.Positive(t, res.Dropped)
}

// A partition of the present is attached with the table locked out for
// writers: an insert that started before the attach and waited for it would
// route its row with the partitions it saw, to the DEFAULT partition, and
// fail that partition's new constraint. Here the attach waits behind a
// transaction that wrote to the DEFAULT partition, and a second writer
// comes while it waits; both rows end in their partition.
func TestAPartitionOfThePresentIsMadeUnderNoWriter(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	m := partition.New(e.db.Pool, partition.Config{LockTimeout: waitFor, Attempts: 1}, e.logger)
	out := partition.OutboxTable(time.Hour, time.Hour)
	insert := `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		VALUES (gen_random_uuid(), 't', 's', 'order-1', 'orders.placed.v1', now(), '{}')`

	first := testenv.Begin(t, e.db.Pool)
	_, err := first.Exec(t.Context(), insert)
	require.NoError(t, err)

	maintained := make(chan error, 1)
	go func() {
		_, err := m.Maintain(context.WithoutCancel(t.Context()), out)
		maintained <- err
	}()
	e.awaitLockWaits(t, 1)
	second := make(chan error, 1)
	go func() {
		_, err := e.db.Pool.Exec(context.WithoutCancel(t.Context()), insert)
		second <- err
	}()
	e.awaitLockWaits(t, 2)
	require.NoError(t, first.Commit(context.WithoutCancel(t.Context())))

	require.NoError(t, <-maintained)
	require.NoError(t, <-second)
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_default`))
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM outbox`))
}

// A drop detaches the partition under the table's lock and drops it in a
// transaction of its own; a partition left detached in between (a process
// that stopped) goes at the next round, and a table that only shares the
// prefix of the partitions' names stays.
func TestAPartitionLeftDetachedGoesAtTheNextRound(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	now := time.Now()
	m, in, _ := e.maintainer(time.Hour, time.Hour, func() time.Time { return now })
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)

	part := e.detachLowest(t) // as a process that stopped in between leaves it
	_, err = e.db.Pool.Exec(t.Context(), `CREATE TABLE processed_events_notes (note text)`)
	require.NoError(t, err)
	require.True(t, e.exists(t, part))

	res, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.Zero(t, res.Dropped, "nothing is past the retention")
	require.False(t, e.exists(t, part), "detached partition %s kept", part)
	require.True(t, e.exists(t, "processed_events_notes"))
}

// A leftover detached table that a session holds is waited for no longer
// than the lock timeout: the round goes on (its partitions made), the table
// is kept, and a later round drops it once the session let it go.
func TestALockedLeftoverDoesNotStallTheRound(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	now := time.Now()
	m, in, _ := e.maintainer(time.Hour, time.Hour, func() time.Time { return now })
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)

	part := e.detachLowest(t) // as a process that stopped in between leaves it
	holder := testenv.Begin(t, e.db.Pool)
	_, err = holder.Exec(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{part}.Sanitize())
	require.NoError(t, err)

	now = now.Add(time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	res, err := m.Maintain(ctx, in)
	require.NoError(t, err, "the round goes on")
	require.Positive(t, res.Created)
	require.True(t, e.exists(t, part), "kept while it is held")

	require.NoError(t, holder.Rollback(context.WithoutCancel(t.Context())))
	_, err = m.Maintain(t.Context(), in)
	require.NoError(t, err)
	require.False(t, e.exists(t, part), "dropped once let go")
}

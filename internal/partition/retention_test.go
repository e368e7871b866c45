package partition_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A retention changed in a rolling deploy: replica A keeps 168h (its
// consumer and its maintenance), replica B is on 24h already. B's
// maintenance drops the partition of an event that A processed three days
// ago; when the event comes again, A's retention guard admits it, and its
// claim is refused in the claim's transaction, because the event is older
// than the oldest partition there is: it is dead-lettered, not claimed
// into the DEFAULT partition and applied a second time.
func TestARetentionChangedOnOneReplicaAppliesNoEventTwice(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			t.Parallel()
			testRetentionChangedOnOneReplica(t, func(cfg *inbox.Config) { cfg.Batched = batched })
		})
	}
}

func testRetentionChangedOnOneReplica(t *testing.T, configure func(*inbox.Config)) {
	e := setup(t, nil)
	e.withNATS(t)
	now := time.Now()
	e.dropLegacyPartition(t)

	const long, short = 168 * time.Hour, 24 * time.Hour
	replica := func(retention time.Duration, clock func() time.Time) (*partition.Maintainer, partition.Table) {
		in := partition.InboxTable(time.Hour, retention, 5*time.Minute)
		return partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{in}, Now: clock}, e.logger), in
	}
	// A's maintenance three days ago made the partition the event lands in.
	threeDaysAgo := now.Add(-72 * time.Hour)
	ev := eventMintedAt(t, threeDaysAgo)
	a, aTable := replica(long, func() time.Time { return threeDaysAgo })
	_, err := a.Maintain(t.Context(), aTable)
	require.NoError(t, err)
	c, stop := e.consume(t, long, configure)
	e.publish(t, ev)
	awaitStats(t, c, inbox.Stats{Processed: 1})
	first := e.partitionOf(t, ev.ID)
	require.NotEqual(t, "processed_events_default", first)
	stop()

	// Today: A's maintenance keeps it, B's drops it.
	a, aTable = replica(long, func() time.Time { return now })
	res, err := a.Maintain(t.Context(), aTable)
	require.NoError(t, err)
	require.Zero(t, res.Dropped)
	b, bTable := replica(short, func() time.Time { return now })
	res, err = b.Maintain(t.Context(), bTable)
	require.NoError(t, err)
	require.Positive(t, res.Dropped)
	require.False(t, e.exists(t, first), "partition %s kept", first)

	c, _ = e.consume(t, long, configure) // A's consumer
	e.publish(t, ev)
	// Refused by the claim, not by the consumer's guard.
	e.requireDeadLettered(t, c, ev, "before the oldest partition of processed_events")
}

// The floor below which a claim is refused is the lowest lower bound of
// processed_events' partitions but DEFAULT, raised by the maintenance as it
// drops them: refused with OF001 below it, let through above it and by an
// operator's override, and a serialization failure (retried) for a
// transaction whose snapshot is older than the drop that raised it.
func TestTheClaimFloorFollowsThePartitions(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	floor := func() pgtype.Timestamptz {
		var lo pgtype.Timestamptz
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT lo FROM partition_floor WHERE parent = 'processed_events'`).Scan(&lo))
		return lo
	}
	claimAt := func(db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, at time.Time) error {
		_, err := db.Exec(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
			VALUES ('c', $1, 't', now(), 1, uuid7_time($1))`, eventMintedAt(t, at).ID)
		return err
	}
	requireCode := func(err error, code string) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, code, pgErr.Code, pgErr.Message)
	}
	in := partition.InboxTable(time.Hour, time.Hour, time.Minute) // partitions go two hours after their end
	now := time.Now()
	maintainAt := func(at time.Time) partition.Result {
		m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{in}, Now: func() time.Time { return at }}, e.logger)
		res, err := m.Maintain(ctx, in)
		require.NoError(t, err)
		return res
	}

	require.Equal(t, pgtype.NegativeInfinity, floor().InfinityModifier, "the migration's partition is FROM (MINVALUE)")
	require.Zero(t, maintainAt(now).Dropped)
	require.Equal(t, pgtype.NegativeInfinity, floor().InfinityModifier)
	// Three hours on, the migration's partition goes, and those up to the
	// end of the current hour.
	require.Positive(t, maintainAt(now.Add(3*time.Hour)).Dropped)
	lowest := now.Truncate(time.Hour).Add(time.Hour)
	require.WithinDuration(t, lowest, floor().Time, 0)
	requireCode(claimAt(e.db.Pool, lowest.Add(-time.Millisecond)), "OF001")
	require.NoError(t, claimAt(e.db.Pool, now.Add(30*time.Hour)), "the DEFAULT partition takes what is above the floor")

	override := testenv.Begin(t, e.db.Pool)
	_, err := override.Exec(ctx, `SELECT set_config('onceflow.claim_past_retention', 'on', true)`)
	require.NoError(t, err)
	require.NoError(t, claimAt(override, lowest.Add(-time.Hour)), "an operator's override")
	require.NoError(t, override.Rollback(ctx))

	// A transaction whose snapshot is older than the drop of the lowest
	// partition cannot take the floor it saw.
	old, err := e.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = old.Rollback(context.WithoutCancel(ctx)) }()
	_, err = old.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.Equal(t, 1, maintainAt(now.Add(4*time.Hour)).Dropped)
	require.WithinDuration(t, lowest.Add(time.Hour), floor().Time, 0)
	requireCode(claimAt(old, lowest.Add(30*time.Minute)), "40001")
	requireCode(claimAt(e.db.Pool, lowest.Add(30*time.Minute)), "OF001")
}

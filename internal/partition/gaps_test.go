package partition_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A partition missing between two others (dropped by hand) is made again
// by the next round, with its bounds.
func TestAMissingPartitionInTheMiddleIsRefilled(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	m, in := e.hourlyInbox(t, now)
	var part string
	var lo, hi time.Time
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT name, lo, hi FROM partitions_of('processed_events')
		WHERE NOT is_default AND lo > $1 ORDER BY lo LIMIT 1 OFFSET 2`, now).Scan(&part, &lo, &hi))
	_, err := e.db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{part}.Sanitize())
	require.NoError(t, err)

	res, err := m.Maintain(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1, res.Created)
	var gotLo, gotHi time.Time
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT lo, hi FROM partitions_of('processed_events') WHERE name = $1`, part).Scan(&gotLo, &gotHi))
	require.True(t, lo.Equal(gotLo) && hi.Equal(gotHi), "[%s, %s), not [%s, %s)", gotLo, gotHi, lo, hi)
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT hi, lead(lo) OVER (ORDER BY lo) AS next FROM partitions_of('processed_events')
		WHERE NOT is_default) AS p WHERE next <> hi`), "gaps left")
}

// partition_create compares the bounds of a partition whose name is taken:
// the same bounds are a partition made already (false), others an error,
// instead of taking it for the partition wanted; a table of that name that
// is no partition (a leftover a later round drops) is not made yet (false).
func TestCreateComparesTheBoundsOfATakenName(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	out := partition.OutboxTable(time.Hour, time.Hour)
	m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{out}, Now: func() time.Time { return now }}, e.logger)
	_, err := m.Maintain(ctx, out)
	require.NoError(t, err)
	var lo, hi time.Time
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT lo, hi FROM partitions_of('outbox')
		WHERE NOT is_default ORDER BY lo DESC NULLS LAST LIMIT 1`).Scan(&lo, &hi))
	create := func(lo, hi time.Time) (bool, error) {
		var created bool
		err := e.db.Pool.QueryRow(ctx, `SELECT partition_create('outbox', 'created_at', $1, $2, '1s', false)`, lo, hi).Scan(&created)
		return created, err
	}
	created, err := create(lo, hi)
	require.NoError(t, err)
	require.False(t, created)
	_, err = create(lo, hi.Add(-10*time.Minute))
	require.ErrorContains(t, err, "exists with bounds")

	later := hi.Add(time.Hour)
	_, err = e.db.Pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{"outbox_p" + later.UTC().Format("20060102_150405")}.Sanitize()+` (LIKE outbox)`)
	require.NoError(t, err)
	created, err = create(later, later.Add(time.Hour))
	require.NoError(t, err)
	require.False(t, created, "a leftover's name, made at a later round")
}

// Rows of the DEFAULT partition below the floor, which no partition will
// take (claims of them are refused), are deleted by the round; a claim
// from a clock far ahead, which its partition will take, stays.
func TestDefaultRowsBelowTheFloorAreCleaned(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	now := time.Now()
	m, in := e.hourlyInbox(t, now)
	e.dropLegacyPartition(t) // the floor rises to where the migration's partition ended

	tx := testenv.Begin(t, e.db.Pool)
	_, err := tx.Exec(ctx, `SELECT set_config('onceflow.claim_past_retention', 'on', true)`) // as a forced replay
	require.NoError(t, err)
	for _, at := range []time.Time{now.Add(-72 * time.Hour), now.Add(-71 * time.Hour), now.Add(30 * time.Hour)} {
		_, err = tx.Exec(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
			VALUES ('c', gen_random_uuid(), 't', $1, 0, $1)`, at)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 3, e.count(t, `SELECT count(*) FROM processed_events_default`))

	res, err := m.Maintain(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 2, res.Cleaned)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM processed_events_default WHERE minted_at > now()`))
}

// hourlyInbox returns a maintainer of processed_events in hourly
// partitions on the clock now, after its first round.
func (e *env) hourlyInbox(t *testing.T, now time.Time) (*partition.Maintainer, partition.Table) {
	t.Helper()
	in := partition.InboxTable(time.Hour, 48*time.Hour, 5*time.Minute)
	m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{in}, Now: func() time.Time { return now }}, e.logger)
	_, err := m.Maintain(t.Context(), in)
	require.NoError(t, err)
	return m, in
}

package partition_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/partition"
)

// defaultRows is how many outbox rows the tests below put in the outbox's
// DEFAULT partition: more than its small size (256 kB), so that they move
// in batches, four of them.
const defaultRows = 20_000

// outboxInDefault makes the partitions of the present of an hourly outbox
// and writes defaultRows rows in its DEFAULT partition, an hour of a range
// five hours ahead, past the partitions made; it returns the table and the
// range's start.
func outboxInDefault(t *testing.T, e *env) (partition.Table, time.Time) {
	t.Helper()
	ctx := t.Context()
	out := partition.OutboxTable(time.Hour, 24*time.Hour)
	_, err := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{out}}, e.logger).Maintain(ctx, out)
	require.NoError(t, err)
	lo := time.Now().Truncate(time.Hour).Add(5 * time.Hour)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, created_at)
		SELECT gen_random_uuid(), 't', 's', 'order-' || n, 'orders.placed.v1', now(), '{}', $1::timestamptz + n * interval '100 ms'
		FROM generate_series(1, $2::integer) AS n`, lo, defaultRows)
	require.NoError(t, err)
	require.Equal(t, defaultRows, e.count(t, `SELECT count(*) FROM outbox_default`))
	return out, lo
}

// sendAll records the relay's one position, an hour ago, covering every
// row of the outbox.
func sendAll(t *testing.T, e *env) {
	t.Helper()
	_, err := e.db.Pool.Exec(t.Context(), `DELETE FROM outbox_batch`)
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(t.Context(), `INSERT INTO outbox_batch (recorded_at, snap, upto, span_snap, span_upto, span_done, epoch, system_id)
		SELECT now() - interval '1 hour', pg_current_snapshot(), u, pg_current_snapshot(), u, u,
		       (SELECT coalesce(max(id), 0) FROM outbox_redrive), outbox_system_id()
		FROM (SELECT max(id) AS u FROM outbox) AS p`)
	require.NoError(t, err)
}

// A redrive while rows move out of the outbox's DEFAULT partition is
// refused: the sent rows already moved are out of the relay's sight, in the
// partition's table not yet attached, and a redrive then would republish
// the others only. Once the partition is made, a redrive republishes every
// row.
func TestARedriveDuringAMoveIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	out, lo := outboxInDefault(t, e)
	sendAll(t, e)

	// A maintenance under way: the move has begun and one batch is out of
	// sight.
	var begun bool
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT partition_move_begin('outbox', 'created_at', $1, $2, '1s')`,
		lo, lo.Add(time.Hour)).Scan(&begun))
	require.True(t, begun)
	var moved int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT moved FROM partition_move_batch('outbox', 'created_at', $1, $2, 5000, true)`,
		lo, lo.Add(time.Hour)).Scan(&moved))
	require.Equal(t, 5000, moved)

	n, err := outbox.Redrive(ctx, e.db.Pool, time.Now().Add(-2*time.Hour))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a redrive during the move republishes %d rows of %d", n, defaultRows)
	require.Equal(t, "55006", pgErr.Code)

	m := partition.New(e.db.Pool, partition.Config{Tables: []partition.Table{out}, Now: func() time.Time { return lo }}, e.logger)
	_, err = m.Maintain(ctx, out)
	require.NoError(t, err)
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_default`))
	n, err = outbox.Redrive(ctx, e.db.Pool, time.Now().Add(-2*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, defaultRows, n)
}

// A move out of the outbox's DEFAULT partition that cannot move its rows,
// unsent, tells how many it left (up to a batch and one), and none once
// the relay has sent them and they moved.
func TestAMoveThatLeavesRowsUnsentTellsHowMany(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	ctx := t.Context()
	out, lo := outboxInDefault(t, e)
	r := newRecorder()
	m := partition.New(e.db.Pool, partition.Config{
		Tables: []partition.Table{out}, Observer: r, LockTimeout: time.Millisecond, Attempts: 1,
		Now: func() time.Time { return lo },
	}, e.logger)
	_, err := m.Maintain(ctx, out)
	require.ErrorContains(t, err, "wait unsent in its DEFAULT partition")
	require.Equal(t, 5001, r.unmoved["outbox"])

	sendAll(t, e)
	_, err = m.Maintain(ctx, out)
	require.NoError(t, err)
	require.Zero(t, r.unmoved["outbox"])
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_default`))
}

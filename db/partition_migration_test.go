package db_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// lastUnpartitioned is the platform migration of the release before the
// inbox and the outbox were partitioned.
const lastUnpartitioned = 7

// A database filled by the release before partitioning migrates to the
// partitioned tables without losing a claim: an event processed before is
// a duplicate after (the inbox's claim, as it runs, answers no row), the
// outbox keeps its rows, ids and order, and its unsent rows stay unsent.
// The migration goes back down as well, rows and all.
func TestPartitioningMigratesADatabaseOfThePreviousRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, provider := testenv.NewPlatformDatabaseAt(t, lastUnpartitioned)
	platform, err := db.Migrations(db.Platform)
	require.NoError(t, err)

	// Rows as the previous release wrote them: claims of events minted an
	// hour ago and now, outbox rows sent and unsent.
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := d.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	old, now := idMintedAt(t, time.Now().Add(-time.Hour)), idMintedAt(t, time.Now())
	for _, id := range []uuid.UUID{old, now} {
		exec(`INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq) VALUES ('payment-orders', $1, 't', now(), 1)`, id)
	}
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		SELECT gen_random_uuid(), 't', 'order', 'order-1', 'orders.placed.v1', now(), json_build_object('n', n) FROM generate_series(1, 3) AS n`)
	exec(`UPDATE outbox SET sent_at = now() WHERE id < 3`)

	require.NoError(t, postgres.Migrate(ctx, d.Pool, postgres.Schema{{Name: db.Platform, FS: platform}}, slog.New(slog.DiscardHandler)))

	// The inbox's claim (db/queries/inbox ClaimEvent) of both events: no row.
	for _, id := range []uuid.UUID{old, now} {
		var minted time.Time
		require.NoError(t, d.Pool.QueryRow(ctx, `SELECT minted_at FROM processed_events WHERE event_id = $1`, id).Scan(&minted))
		require.True(t, minted.Equal(event.Envelope{ID: id}.Minted()), "minted_at %s of %s", minted, id)
		rows, err := d.Pool.Query(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
			VALUES ('payment-orders', $1, 't', now(), 2, uuid7_time($1)) ON CONFLICT DO NOTHING RETURNING event_id`, id)
		require.NoError(t, err)
		require.False(t, rows.Next(), "event %s claimed again after the migration", id)
		rows.Close()
		require.NoError(t, rows.Err())
	}
	var partitioned bool
	require.NoError(t, d.Pool.QueryRow(ctx, `SELECT count(*) = 2 FROM pg_partitioned_table WHERE partrelid IN ('processed_events'::regclass, 'outbox'::regclass)`).Scan(&partitioned))
	require.True(t, partitioned)

	// The outbox: the same ids in order, the unsent row unsent, new rows after.
	exec(`INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		VALUES (gen_random_uuid(), 't', 'order', 'order-1', 'orders.placed.v1', now(), '{"n": 4}')`)
	type row struct {
		ID   int64
		N    string
		Sent bool
	}
	outbox := func(query string) []row {
		rows, err := d.Pool.Query(ctx, query)
		require.NoError(t, err)
		var got []row
		for rows.Next() {
			var r row
			require.NoError(t, rows.Scan(&r.ID, &r.N, &r.Sent))
			got = append(got, r)
		}
		require.NoError(t, rows.Err())
		return got
	}
	want := []row{{1, "1", true}, {2, "2", true}, {3, "3", false}, {4, "4", false}}
	require.Equal(t, want, outbox(`SELECT id, data->>'n', id NOT IN (SELECT id FROM outbox_unsent) FROM outbox ORDER BY id`))

	_, err = provider.DownTo(ctx, lastUnpartitioned)
	require.NoError(t, err)
	require.Equal(t, want, outbox(`SELECT id, data->>'n', sent_at IS NOT NULL FROM outbox ORDER BY id`))
	var claims int
	require.NoError(t, d.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_events`).Scan(&claims))
	require.Equal(t, 2, claims)
}

// idMintedAt returns a fresh UUIDv7 that carries the time at.
func idMintedAt(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	first := event.FirstIDAt(at)
	copy(id[:6], first[:6])
	return id
}

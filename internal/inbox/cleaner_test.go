package inbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestCleanerRemovesOldRowsOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.NewServiceDatabase(t, "")
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))

	// insert adds a row per age, of an event minted that long ago and
	// processed now, and returns their ids: the cleaner goes by the time in
	// the id, not by processed_at.
	insert := func(ages ...time.Duration) []uuid.UUID {
		var ids []uuid.UUID
		for _, age := range ages {
			id := idMintedAt(t, time.Now().Add(-age))
			_, err := db.Pool.Exec(ctx, `
				INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq)
				VALUES ('c', $1, 't', now(), 1)`,
				id)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		return ids
	}
	remaining := func() []uuid.UUID {
		rows, err := db.Pool.Query(ctx, `SELECT event_id FROM processed_events ORDER BY event_id`)
		require.NoError(t, err)
		var ids []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}

	const day = 24 * time.Hour
	// Rows are kept an hour beyond the retention, for a consumer that let
	// an event through its retention guard just before it ran out.
	old := insert(8*day, 9*day, 30*day, 7*day+61*time.Minute, 365*day)
	young := insert(time.Minute, day, 7*day-time.Hour, 7*day+59*time.Minute)

	// Default retention of 7 days; two rows per statement, so that Clean has
	// to loop.
	cleaner := inbox.NewCleaner(db.Pool, inbox.CleanerConfig{BatchSize: 2}, logger)
	n, err := cleaner.Clean(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(old), n)
	require.ElementsMatch(t, young, remaining())

	n, err = cleaner.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// Run cleans at start and on every interval, and stops with its context.
	runner := inbox.NewCleaner(db.Pool, inbox.CleanerConfig{Interval: 20 * time.Millisecond}, logger)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	insert(10 * day)
	require.Eventually(t, func() bool {
		var count int64
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_events`).Scan(&count)
		return err == nil && count == int64(len(young))
	}, waitFor, tick)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
	require.ElementsMatch(t, young, remaining())
}

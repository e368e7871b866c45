package outbox_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A transaction that stays open while the relay publishes rows with higher
// ids, over several flushes whose marks record the relay's position past
// its rows, commits them at last: they are found below the position, all
// of them though they are more than a batch, published before the next
// event of their aggregate, and nothing is skipped or published twice.
func TestALateCommitBelowThePositionIsFound(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")

	late := testenv.Begin(t, f.db.Pool)
	lates := make([]event.Envelope, 3)
	for i := range lates {
		lates[i] = newEvent(t, event.OrderPlaced, "order-late", i+1)
		require.NoError(t, outbox.Enqueue(ctx, late, lates[i])) // the lowest ids, not yet committed
	}
	r := f.relay(outbox.RelayConfig{BatchSize: 2})
	var others []event.Envelope
	for round := range 3 {
		for i := range 5 {
			ev := newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d-%d", round, i), 1)
			others = append(others, ev)
			enqueue(t, f.db.Pool, ev)
		}
		n, err := r.Flush(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n, "round %d", round)
	}
	requireLag(t, r, 0) // the open transaction's rows are not seen yet

	require.NoError(t, late.Commit(ctx))
	next := newEvent(t, event.OrderPlaced, "order-late", len(lates)+1)
	enqueue(t, f.db.Pool, next) // written after the late rows committed
	requireLag(t, r, int64(len(lates))+1)
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(lates)+1, n)
	requireLag(t, r, 0)

	var order []string
	for _, m := range streamMsgs(t, f.js, streams.Orders) {
		if m.Header.Get(event.HeaderSubject) == "order-late" {
			order = append(order, m.Header.Get(event.HeaderID))
		}
	}
	want := []string{lates[0].ID.String(), lates[1].ID.String(), lates[2].ID.String(), next.ID.String()}
	require.Equal(t, want, order, "the aggregate's events in the order they were written")
	counts := published()
	require.Len(t, counts, len(others)+len(lates)+1)
	for id, c := range counts {
		require.Equal(t, 1, c, "publishes of %s", id)
	}
}

// Redrive makes the rows sent since a time unsent, below the relay's
// position: the relay publishes them again, and only them.
func TestRedriveRepublishesTheRowsSentSince(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	r := f.relay(outbox.RelayConfig{BatchSize: 2})

	batch := func(prefix string) []event.Envelope {
		evs := make([]event.Envelope, 3)
		for i := range evs {
			evs[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("%s-%d", prefix, i), 1)
		}
		enqueue(t, f.db.Pool, evs...)
		n, err := r.Flush(ctx)
		require.NoError(t, err)
		require.Equal(t, len(evs), n)
		return evs
	}
	old := batch("old")
	var since time.Time
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	recent := batch("recent")
	batch("last")

	n, err := outbox.Redrive(ctx, f.db.Pool, since)
	require.NoError(t, err)
	require.EqualValues(t, 6, n)
	requireLag(t, r, 6)
	sent, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, sent)
	requireLag(t, r, 0)

	counts := published()
	for _, ev := range old {
		require.Equal(t, 1, counts[ev.ID.String()], "an event sent before the redrive's time")
	}
	for _, ev := range recent {
		require.Equal(t, 2, counts[ev.ID.String()], "an event sent since the redrive's time")
	}
}

// A redrive that comes between a claim and its mark: the position that
// claim computed assumed sent the rows the redrive made unsent, and the mark
// must not record it, or the relay would never find them.
func TestARedriveBetweenAClaimAndItsMarkLosesNoRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	var since time.Time
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since))
	first := make([]event.Envelope, 3)
	for i := range first {
		first[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("first-%d", i), 1)
	}
	enqueue(t, f.db.Pool, first...)
	r := f.relay(outbox.RelayConfig{BatchSize: 8})
	n, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(first), n)

	second := newEvent(t, event.OrderPlaced, "second", 1)
	enqueue(t, f.db.Pool, second)
	redriven := false
	outbox.SetAfterPublish(r, func() error {
		if !redriven {
			redriven = true
			n, err := outbox.Redrive(ctx, f.db.Pool, since)
			require.NoError(t, err)
			require.EqualValues(t, len(first), n)
		}
		return nil
	})
	n, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(first)+1, n, "the second event, and the first ones again")
	requireLag(t, r, 0)
	counts := published()
	for _, ev := range first {
		require.Equal(t, 2, counts[ev.ID.String()], "publishes of a redriven event")
	}
	require.Equal(t, 1, counts[second.ID.String()])
}

// The relay never updates or deletes a row: after thousands of events
// relayed with autovacuum off, the outbox and outbox_sent have no dead
// tuple.
func TestRelayingLeavesNoDeadTuples(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	parts := func() []string {
		return column[string](t, f.db, `SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent IN ('outbox'::regclass, 'outbox_sent'::regclass) ORDER BY 1`)
	}
	for _, p := range parts() {
		_, err := f.db.Pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{p}.Sanitize()+` SET (autovacuum_enabled = off)`)
		require.NoError(t, err)
	}

	r := f.relay(outbox.RelayConfig{BatchSize: 256})
	const rounds, perRound = 20, 150
	total := 0
	for round := range rounds {
		evs := make([]event.Envelope, perRound)
		for i := range evs {
			evs[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d", i%7), round)
		}
		enqueue(t, f.db.Pool, evs...)
		n, err := r.Flush(ctx)
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, rounds*perRound, total)
	requireLag(t, r, 0)

	// Each backend reports its counts when it goes idle, a second or more
	// apart (pg_stat_force_next_flush flushes only its caller's): the test
	// waits until every row written is counted.
	var rows, dead, updated, deleted int64
	names := parts()
	require.Eventually(t, func() bool {
		err := f.db.Pool.QueryRow(ctx, `
			SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint,
			       coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint
			FROM pg_stat_user_tables WHERE relname = ANY($1)`, names).Scan(&rows, &dead, &updated, &deleted)
		return err == nil && rows == 2*rounds*perRound
	}, time.Minute, 100*time.Millisecond, "the outbox's rows and their marks counted")
	require.Zero(t, dead, "dead tuples")
	require.Zero(t, updated)
	require.Zero(t, deleted)
}

// lastBeforeSent is the platform migration of the release that marked
// outbox rows sent with an UPDATE of sent_at.
const lastBeforeSent = 11

// A database filled by the release that updated sent_at migrates to
// outbox_sent: the rows it sent stay sent, with their times (a redrive
// still finds them), the relay publishes the unsent ones and only them,
// and rows written after the migration follow.
func TestOutboxSentMigratesADatabaseOfThePreviousRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, _ := testenv.NewPlatformDatabaseAt(t, lastBeforeSent)
	platform, err := db.Migrations(db.Platform)
	require.NoError(t, err)

	// As the previous release wrote them: rows 1-4 and 6 sent (6 late, as
	// a row that committed late is), 5, 7 and 8 not.
	evs := make([]event.Envelope, 8)
	for i := range evs {
		evs[i] = newEvent(t, event.OrderPlaced, fmt.Sprintf("order-%d", i), 1)
	}
	enqueue(t, d.Pool, evs...)
	_, err = d.Pool.Exec(ctx, `UPDATE outbox SET sent_at = now() - interval '10 minutes' WHERE id IN (1, 2, 3, 4)`)
	require.NoError(t, err)
	_, err = d.Pool.Exec(ctx, `UPDATE outbox SET sent_at = now() - interval '5 minutes' WHERE id = 6`)
	require.NoError(t, err)

	require.NoError(t, postgres.Migrate(ctx, d.Pool, postgres.Schema{{Name: db.Platform, FS: platform}}, slog.New(slog.DiscardHandler)))
	require.Equal(t, []int64{5, 7, 8}, column[int64](t, d, `SELECT id FROM outbox_unsent ORDER BY id`))
	require.Equal(t, []int64{1, 2, 3, 4, 6}, column[int64](t, d, `SELECT id FROM outbox_sent ORDER BY id`))
	after := newEvent(t, event.OrderPlaced, "order-after", 1)
	enqueue(t, d.Pool, after)

	n := testenv.NewNATS(t)
	js := n.JetStream(t)
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{})))
	published := countPublishes(t, n, "orders.>")
	r := outbox.NewRelay(d.Pool, js, outbox.RelayConfig{BatchSize: 2}, slog.New(slog.DiscardHandler))
	sent, err := r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, sent)
	requireLag(t, r, 0)
	want := map[string]int{evs[4].ID.String(): 1, evs[6].ID.String(): 1, evs[7].ID.String(): 1, after.ID.String(): 1}
	require.Equal(t, want, published())

	// A redrive of the last 7 minutes republishes row 6 and the rows sent
	// since the migration.
	redriven, err := outbox.Redrive(ctx, d.Pool, time.Now().Add(-7*time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 5, redriven)
	sent, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, sent)
	require.Equal(t, 1, published()[evs[5].ID.String()])
}

package outbox_test

import (
	"context"
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
	requireOracle(t, f.db, counts)
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

	batch := func(prefix string) []event.Envelope { return enqueueAndFlush(t, f, r, prefix, 3) }
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

// A redrive that comes between a claim and its record: the position that
// claim computed assumed sent the rows the redrive made unsent, and must
// not count once recorded, or the relay would never find them. The batch
// in flight is published again with them.
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
	require.Equal(t, 1+len(first)+1, n, "the second event, then the first ones and it again")
	requireLag(t, r, 0)
	counts := published()
	for _, ev := range first {
		require.Equal(t, 2, counts[ev.ID.String()], "publishes of a redriven event")
	}
	require.Equal(t, 2, counts[second.ID.String()], "the batch in flight at the redrive")
}

// The relay never updates or deletes a row: after thousands of events
// relayed with autovacuum off, the outbox and outbox_batch, where the relay
// records its positions, have no dead tuple.
func TestRelayingLeavesNoDeadTuples(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	parts := func() []string {
		return column[string](t, f.db, `SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'outbox'::regclass UNION ALL SELECT 'outbox_batch' ORDER BY 1`)
	}
	for _, p := range parts() {
		_, err := f.db.Pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{p}.Sanitize()+` SET (autovacuum_enabled = off)`)
		require.NoError(t, err)
	}

	before := column[int64](t, f.db, `SELECT count(*) FROM outbox_batch`)[0]
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
	var rows, positions, dead, updated, deleted int64
	names := parts()
	recorded := column[int64](t, f.db, `SELECT count(*) FROM outbox_batch`)[0] - before
	require.Eventually(t, func() bool {
		err := f.db.Pool.QueryRow(ctx, `
			SELECT coalesce(sum(n_tup_ins) FILTER (WHERE relname <> 'outbox_batch'), 0)::bigint,
			       coalesce(sum(n_tup_ins) FILTER (WHERE relname = 'outbox_batch'), 0)::bigint,
			       coalesce(sum(n_dead_tup), 0)::bigint,
			       coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint
			FROM pg_stat_user_tables WHERE relname = ANY($1)`, names).Scan(&rows, &positions, &dead, &updated, &deleted)
		return err == nil && rows == rounds*perRound && positions == recorded
	}, time.Minute, 100*time.Millisecond, "the outbox's rows and the positions counted")
	require.LessOrEqual(t, recorded, int64(rounds*(perRound/256+2)), "a position per batch, not per row")
	require.Zero(t, dead, "dead tuples")
	require.Zero(t, updated)
	require.Zero(t, deleted)
}

// lastBeforeSent is the platform migration of the release that marked
// outbox rows sent with an UPDATE of sent_at.
const lastBeforeSent = 11

// A database filled by the release that updated sent_at migrates to the
// relay's positions: the rows it sent stay sent, the relay publishes the
// unsent ones and only them, and rows written after the migration follow.
// A redrive to before the migration republishes every row it kept: the
// times of its sends are not kept, only that they happened before it.
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

	redriven, err := outbox.Redrive(ctx, d.Pool, time.Now().Add(-7*time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, len(evs)+1, redriven)
	sent, err = r.Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs)+1, sent)
	require.Equal(t, 1, published()[evs[0].ID.String()], "sent before the migration, and again")
	require.Equal(t, 2, published()[after.ID.String()], "sent after the migration, and again")
}

// A producer in flight while 00012 ran: its row was inserted before that
// migration read the outbox and committed while it waited for its lock,
// so it took xact_id 0 below the position 00012 recorded, and was never
// sent. 00013 locks the outbox before it reads it and makes every row that
// no mark names unsent: the row is published.
func TestTheRowOfAProducerInFlightDuring00012IsPublished(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, provider := testenv.NewPlatformDatabaseAt(t, lastBeforeSent)
	enqueue(t, d.Pool, newEvent(t, event.OrderPlaced, "order-before", 1))
	_, err := d.Pool.Exec(ctx, `UPDATE outbox SET sent_at = now()`)
	require.NoError(t, err)

	producer := testenv.Begin(t, d.Pool)
	inFlight := newEvent(t, event.OrderPlaced, "order-in-flight", 1)
	_, err = producer.Exec(ctx, `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
		VALUES ($1, 'OrderPlaced', 'test', 'order-in-flight', 'orders.placed.v1', now(), '{}')`, inFlight.ID)
	require.NoError(t, err)
	// A row with a higher id, committed and sent before 00012 runs.
	enqueue(t, d.Pool, newEvent(t, event.OrderPlaced, "order-after", 1))
	_, err = d.Pool.Exec(ctx, `UPDATE outbox SET sent_at = now() WHERE sent_at IS NULL`)
	require.NoError(t, err)
	migrated := make(chan error, 1)
	go func() {
		_, err := provider.UpTo(context.WithoutCancel(ctx), 12)
		migrated <- err
	}()
	// 00012 has read the outbox and recorded its position, and waits for
	// the producer's lock to add xact_id.
	require.Eventually(t, func() bool {
		return column[int64](t, d, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%ADD COLUMN xact_id%'`)[0] == 1
	}, 30*time.Second, 10*time.Millisecond, "00012 waiting for the producer")
	require.NoError(t, producer.Commit(ctx))
	require.NoError(t, <-migrated)
	require.Empty(t, column[int64](t, d, `SELECT id FROM outbox_unsent`), "00012 lost the row")
	require.Equal(t, []string{"0"}, column[string](t, d, `SELECT xact_id::text FROM outbox WHERE subject = 'order-in-flight'`))

	_, err = provider.UpTo(ctx, 13)
	require.NoError(t, err)
	require.Equal(t, []string{"order-in-flight"}, column[string](t, d, `SELECT subject FROM outbox_unsent`))
}

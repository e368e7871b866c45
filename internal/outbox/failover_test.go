package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/hapg"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// haFixture is a relay's world on a highly available database: a Patroni
// cluster, a NATS server with the saga's streams, and a relay running on
// the cluster's multi-host URL until the test ends.
type haFixture struct {
	db *testenv.HADatabase
	js jetstream.JetStream
}

func setupHA(t *testing.T, cfg hapg.Config) *haFixture {
	t.Helper()
	n := testenv.NewNATS(t)
	js, err := jetstream.New(n.Conn(t), jetstream.WithPublishAsyncTimeout(10*time.Second))
	require.NoError(t, err)
	require.NoError(t, streams.Provision(t.Context(), js, streams.Saga(streams.Config{})))
	f := &haFixture{db: testenv.NewHADatabase(t, cfg, ""), js: js}
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	// As the saga's services run it; a short poll bounds the wait for a
	// commit made while the LISTEN session was being re-established.
	run(t, outbox.NewRelay(f.db.Pool, js, outbox.RelayConfig{Pipelined: true, PollInterval: 200 * time.Millisecond}, logger))
	return f
}

// producer commits one OrderPlaced event per transaction, each of an
// aggregate of its own, until stopped, riding through the database's
// faults: a failed transaction is dropped (whether its commit happened is
// for the oracle to find out).
type producer struct {
	mu        sync.Mutex
	committed []string // event ids whose commit returned nil
	failures  int
	stop      context.CancelFunc
	done      chan struct{}
}

func startProducer(t *testing.T, pool *pgxpool.Pool) *producer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &producer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ctx.Err() == nil; i++ {
			id, err := commitEvent(ctx, pool, fmt.Sprintf("order-%d", i))
			p.mu.Lock()
			if err == nil {
				p.committed = append(p.committed, id)
			} else if ctx.Err() == nil {
				p.failures++
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.halt)
	return p
}

// halt stops the producer and waits for it.
func (p *producer) halt() {
	p.stop()
	<-p.done
}

func (p *producer) commits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.committed)
}

// awaitCommits waits until n more commits than now have succeeded: the
// producer's pool reached a primary that accepts writes.
func (p *producer) awaitCommits(t *testing.T, n int) {
	t.Helper()
	from := len(p.commits())
	require.Eventually(t, func() bool { return len(p.commits()) >= from+n }, 30*time.Second, 10*time.Millisecond,
		"%d commits after %d", n, from)
}

func commitEvent(ctx context.Context, pool *pgxpool.Pool, aggregate string) (string, error) {
	ev, err := event.New("test", event.OrderPlaced, aggregate, payload{Seq: 1})
	if err != nil {
		return "", err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, ev) })
	return ev.ID.String(), err
}

// haOracle compares what the producer saw committed and what the stream
// holds with the outbox rows of the database as it is now, on the new
// primary, once the relay is idle.
type haOracle struct {
	lost        []string // committed, and not in the outbox: a lost effect
	phantom     []string // published, and not in the outbox: a phantom event
	unpublished []string // in the outbox and not published
}

func checkHA(t *testing.T, f *haFixture, committed []string) haOracle {
	t.Helper()
	ctx := t.Context()
	// The relay is idle once nothing is unsent; it publishes rows committed
	// before the fault again if their record was lost with the primary.
	require.Eventually(t, func() bool {
		var unsent int
		err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_unsent`).Scan(&unsent)
		return err == nil && unsent == 0
	}, 30*time.Second, 20*time.Millisecond, "the relay drains the outbox on the new primary")
	rows, err := f.db.Pool.Query(ctx, `SELECT event_id::text FROM outbox`)
	require.NoError(t, err)
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	stream := map[string]bool{}
	for _, m := range streamMsgs(t, f.js, streams.Orders) {
		stream[m.Header.Get(event.HeaderID)] = true
	}
	var o haOracle
	for _, id := range committed {
		if !slices.Contains(held, id) {
			o.lost = append(o.lost, id)
		}
	}
	for id := range stream {
		if !slices.Contains(held, id) {
			o.phantom = append(o.phantom, id)
		}
	}
	for _, id := range held {
		if !stream[id] {
			o.unpublished = append(o.unpublished, id)
		}
	}
	slices.Sort(o.lost)
	slices.Sort(o.phantom)
	return o
}

// awaitRelayLeads waits until a relay session holds the relay lock and a
// LISTEN session is open on the database's primary now.
func awaitRelayLeads(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var locks, listeners int
		err := pool.QueryRow(t.Context(), `
			SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
			       (SELECT count(*) FROM pg_stat_activity
			        WHERE datname = current_database() AND application_name = $1)`,
			outbox.ListenApplicationName).Scan(&locks, &listeners)
		return err == nil && locks > 0 && listeners > 0
	}, 30*time.Second, 20*time.Millisecond, "the relay's lock and LISTEN session on the primary")
}

// With a synchronous standby, a relay under a steady producer rides
// through a planned switchover and through the primary's death: every
// commit the producer saw is on the new primary and published, and nothing
// was published that the new primary does not hold.
func TestARelayRidesThroughAFailoverWithASynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setupHA(t, hapg.Config{})
	p := startProducer(t, f.db.Pool)
	p.awaitCommits(t, 20)

	_, err := f.db.Cluster.Switchover(ctx)
	require.NoError(t, err)
	p.awaitCommits(t, 20)
	awaitRelayLeads(t, f.db.Pool)

	_, err = f.db.Cluster.KillPrimary(ctx)
	require.NoError(t, err)
	p.awaitCommits(t, 20)
	awaitRelayLeads(t, f.db.Pool)
	p.halt()

	committed := p.commits()
	o := checkHA(t, f, committed)
	require.Empty(t, o.lost, "committed events missing on the new primary")
	require.Empty(t, o.phantom, "published events the new primary does not hold")
	require.Empty(t, o.unpublished, "events held and never published")
	t.Logf("%d commits, %d failed transactions across a switchover and a failover", len(committed), p.failures)
}

// With asynchronous replication and the standby held back, the events
// committed on the primary after the hold are published and then lost with
// it: the oracle names each of them as a lost commit and a phantom event.
// This is what the synchronous standby above prevents, and proof that the
// oracle would see it.
func TestAFailoverWithAnAsynchronousStandbyLosesCommitsTheRelayPublished(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setupHA(t, hapg.Config{Async: true})
	var before, after []string
	for i := range 5 {
		id, err := commitEvent(ctx, f.db.Pool, fmt.Sprintf("before-%d", i))
		require.NoError(t, err)
		before = append(before, id)
	}
	awaitMsgs(t, f.js, streams.Orders, uint64(len(before)), 30*time.Second)

	primary, err := f.db.Cluster.Primary(ctx)
	require.NoError(t, err)
	f.db.Cluster.HoldReplication()
	for i := range 5 {
		id, err := commitEvent(ctx, f.db.Pool, fmt.Sprintf("after-%d", i))
		require.NoError(t, err)
		after = append(after, id)
	}
	awaitMsgs(t, f.js, streams.Orders, uint64(len(before)+len(after)), 30*time.Second)
	requireStandbyBehind(t, f.db, primary)

	_, err = f.db.Cluster.KillPrimary(ctx)
	require.NoError(t, err)
	o := checkHA(t, f, append(slices.Clone(before), after...))
	slices.Sort(after)
	require.Equal(t, after, o.lost, "the commits made after the hold, lost with the primary")
	require.Equal(t, after, o.phantom, "the events published after the hold, which the new primary does not hold")
	require.Empty(t, o.unpublished)
}

// requireStandbyBehind checks that the standby has not received the WAL
// the primary wrote: the hold, not timing, made the commits since
// primary-only.
func requireStandbyBehind(t *testing.T, db *testenv.HADatabase, primary int) {
	t.Helper()
	ctx := t.Context()
	var written string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&written))
	conn, err := pgx.Connect(ctx, db.Cluster.NodeURL((primary+1)%2, db.Name))
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var behind *bool // NULL: the standby never streamed
	err = conn.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn() < $1::pg_lsn`, written).Scan(&behind)
	require.NoError(t, err)
	require.NotNil(t, behind, "the standby's WAL receiver has received nothing")
	require.True(t, *behind, "the standby received WAL up to %s", written)
}

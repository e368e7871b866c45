package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestClusterLeaderLoss runs the saga on a three-node cluster with R3
// streams and consumers and, during the load, kills with SIGKILL the node
// leading the ORDERS stream, then in the next round the node leading the
// payment-orders consumer, starting each again a moment later, four rounds
// in all: publishes and acks move to the new leaders, unacknowledged
// messages are redelivered, and the inbox drops what was processed.
func TestClusterLeaderLoss(t *testing.T) {
	t.Parallel()
	sys, d := clusterScenario(t, false, nil, clusterLoad())
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 4 {
			if err := d.awaitOrders(ctx, 30+40*i); err != nil {
				return err
			}
			var (
				node  *natsServer
				fault string
				err   error
			)
			if i%2 == 0 {
				node, err = sys.streamLeader(ctx, streams.Orders)
				fault = "kill_9_stream_leader:" + streams.Orders
			} else {
				node, err = sys.consumerLeader(ctx, streams.Orders, streams.PaymentOrders)
				fault = "kill_9_consumer_leader:" + streams.PaymentOrders
			}
			if err != nil {
				return err
			}
			if err := sys.bounce(ctx, node, fault); err != nil {
				return err
			}
		}
		return nil
	})
	sys.verifyStoredOnce(d, err)
}

// TestClusterPartition cuts the node leading the ORDERS stream off from the
// other two (every route to and from it through a proxy that resets its
// connections) for six seconds, twice during the load: the majority elects new
// leaders and the saga goes on through it; services connected to the cut
// node wait for it. Then the partition heals and the node catches up.
func TestClusterPartition(t *testing.T) {
	t.Parallel()
	sys, d := clusterScenario(t, true, nil, clusterLoad())
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 2 {
			if err := d.awaitOrders(ctx, 40+60*i); err != nil {
				return err
			}
			node, err := sys.streamLeader(ctx, streams.Orders)
			if err != nil {
				return err
			}
			if err := sys.partition(ctx, node, 6*time.Second); err != nil {
				return err
			}
			sys.faults.add("partition_6s:stream_leader", 1)
			if err := sys.awaitCurrent(ctx, 90*time.Second); err != nil {
				return err
			}
		}
		return nil
	})
	sys.verifyStoredOnce(d, err)
}

// partition cuts the routes to and from node for d.
func (sys *system) partition(ctx context.Context, node *natsServer, d time.Duration) error {
	cut := -1
	for i, n := range sys.cluster.nodes {
		if n == node {
			cut = i
		}
	}
	if cut < 0 || sys.cluster.links == nil {
		return fmt.Errorf("cannot cut %s off: not a node of a proxied cluster", node.name)
	}
	// Connections reset, and new ones too, until the toxic goes: a node
	// cut off. (A toxic that drops bytes on a live connection, which TCP
	// never does, lost route protocol messages for good: a consumer
	// created after the heal had no responders from the healed node.)
	drop := func(stream string) toxic { return toxic{"reset_peer", stream, 1, `{"timeout":0}`} }
	g, gctx := errgroup.WithContext(ctx)
	for i, row := range sys.cluster.links {
		for j, link := range row {
			if link == nil || (i != cut && j != cut) {
				continue
			}
			for _, stream := range []string{"upstream", "downstream"} {
				g.Go(func() error { return link.apply(gctx, drop(stream), d) })
			}
		}
	}
	return g.Wait()
}

// TestClusterRollingRestart restarts the three nodes one after the other
// during the load, as an upgrade would: each is stopped gracefully
// (SIGTERM), started again on its store, and caught up before the next.
func TestClusterRollingRestart(t *testing.T) {
	t.Parallel()
	sys, d := clusterScenario(t, false, nil, clusterLoad())
	err := d.run(t.Context(), func(ctx context.Context) error {
		if err := d.awaitOrders(ctx, 30); err != nil {
			return err
		}
		for _, node := range sys.cluster.nodes {
			node.stop()
			sleepCtx(ctx, time.Second)
			if err := node.start(ctx); err != nil {
				return err
			}
			sys.faults.add("rolling_restart:"+node.name, 1)
			if err := sys.awaitCurrent(ctx, 90*time.Second); err != nil {
				return err
			}
		}
		return nil
	})
	sys.verifyStoredOnce(d, err)
}

// TestClusterAtomicBatches has every relay publish every batch as an
// atomic batch (OUTBOX_ATOMIC_BATCH_MIN=1) and kills the node leading the
// ORDERS stream, three times, the moment an atomic batch to it is on the
// wire and not yet acknowledged (a watch on the wire sees the batches and
// their acks; the leader is frozen with SIGSTOP the moment one is seen, so
// that it cannot ack it before the kill, and a round whose batch was acked
// all the same is followed by another, up to ten): the batch is lost with
// its leader and the relay publishes it again to the new one. After the first kill, order's outbox rows sent
// in the last 20 seconds are re-driven (`onceflow outbox redrive`), so that
// the relay publishes batches holding events the new leader already
// stores: the stream refuses each such batch whole (error 10201) and the
// relay publishes it a message at a time, its duplicates dropped. No event
// may be lost or stored twice.
func TestClusterAtomicBatches(t *testing.T) {
	t.Parallel()
	sys, d := clusterScenario(t, false, []string{"OUTBOX_ATOMIC_BATCH_MIN=1"}, clusterLoad())
	watch := newPublishWatch(t, sys.cluster.urls(), sys.natsClient(natsauth.Admin).Options(natsauth.Admin)...)
	var cutOff []string // the batches under way at the kills
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := 0; i < 3 || (watch.neverAcked(cutOff) == 0 && i < 10); i++ {
			if err := d.awaitOrders(ctx, 30+40*min(i, 2)); err != nil {
				return err
			}
			node, err := sys.streamLeader(ctx, streams.Orders)
			if err != nil {
				return err
			}
			open := awaitOpenBatch(ctx, watch, streams.Orders, 10*time.Second)
			node.freeze()
			if err := sys.bounce(ctx, node, "kill_9_stream_leader:"+streams.Orders); err != nil {
				return err
			}
			cutOff = append(cutOff, open...)
			if i == 0 {
				if err := sys.redrive(ctx, "order", "20s"); err != nil {
					return err
				}
				sys.faults.add("redrive_after_leader_change:order", 1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.waitQuiet(2 * time.Minute); err != nil {
		t.Errorf("e2e: %v", err)
	}
	o := watch.outcomes()
	sys.observed.add("atomic_batches", int64(o.seen))
	killedDuring := watch.neverAcked(cutOff)
	sys.observed.add("stream_leader_kill_during_atomic_batch", int64(killedDuring))
	sys.observed.add("atomic_batches_refused_10201", int64(o.refusedDuplicate))
	t.Logf("atomic batches: seen=%d stored=%d refused_duplicate_10201=%d failed=%d acked_before_commit_seen=%d under_way_at_kills=%d cut_off=%d",
		o.seen, o.stored, o.refusedDuplicate, o.failed, o.ackedFirst, len(cutOff), killedDuring)
	sys.verify(d, expect{})
	sys.checkStoredOnce()
	if killedDuring == 0 {
		t.Errorf("e2e: no kill of the ORDERS leader met an atomic batch under way")
	}
	if o.refusedDuplicate == 0 {
		t.Errorf("e2e: no atomic batch was refused for holding an event the stream had (10201): the path was not taken")
	}
}

// awaitOpenBatch waits up to timeout until an atomic batch to stream,
// begun from now on, is on the wire and unacknowledged, and returns the
// batches then under way (none if the wait timed out).
func awaitOpenBatch(ctx context.Context, w *publishWatch, stream string, timeout time.Duration) []string {
	since := time.Now()
	deadline := since.Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if open := w.openBatches(stream, since); len(open) > 0 {
			return open
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// redrive runs `onceflow outbox redrive --since since` on kind's database,
// as an operator would.
func (sys *system) redrive(ctx context.Context, kind, since string) error {
	cmd := exec.CommandContext(ctx, shared.onceflowBin, "outbox", "redrive", "--since", since)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + sys.pg.url(sys.dbName(kind))}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("outbox redrive on %s: %w\n%s", kind, err, out.Bytes())
	}
	sys.t.Logf("redrive %s: %s", kind, bytes.TrimSpace(out.Bytes()))
	return nil
}

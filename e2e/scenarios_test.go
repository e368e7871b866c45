package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/streams"
)

// scenario starts a system with deployment, seeds a driver for a workload
// of n orders, and returns both.
func scenario(t *testing.T, dep deployment, n int) (*system, *driver) {
	t.Helper()
	sys := newSystem(t)
	return sys, startDriver(t, sys, dep, n)
}

func startDriver(t *testing.T, sys *system, dep deployment, n int) *driver {
	t.Helper()
	sys.start(dep)
	d := newDriver(sys, newWorkload(n))
	if err := d.seedData(t.Context()); err != nil {
		t.Fatalf("e2e: seed: %v", err)
	}
	return d
}

// TestHappyPath places a thousand orders across many customers and SKUs,
// with mixed outcomes (confirmed, rejected for funds, cancelled for stock),
// and no fault.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(1000))
	if err := d.run(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{exactCounts: true})
}

// TestDuplicateStorm re-publishes every event of the saga three times, each
// copy with a fresh Nats-Msg-Id so that the broker's duplicate window does
// not help, and sends every POST twice.
func TestDuplicateStorm(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(300))
	d.repeat = true
	dup := newDuplicator(sys.js, 3)
	ctx, stop := context.WithCancel(t.Context())
	dupErr := make(chan error, 1)
	go func() { dupErr <- dup.run(ctx) }()
	if err := d.run(t.Context(), nil); err != nil {
		stop()
		t.Fatal(err)
	}
	// The events of the last orders are copied too.
	for {
		if err := sys.waitQuiet(2 * time.Minute); err != nil {
			stop()
			t.Fatalf("e2e: %v", err)
		}
		ok, err := dup.caughtUp(t.Context())
		if err != nil {
			t.Fatalf("e2e: %v", err)
		}
		if ok {
			break
		}
	}
	stop()
	if err := <-dupErr; err != nil {
		t.Fatalf("e2e: %v", err)
	}
	sys.faults.add("republished", dup.published.Load())
	sys.verify(d, expect{exactCounts: true, minDuplicates: dup.deliveries.Load()})
}

// TestReplicas runs three instances of payment and two of inventory on the
// same durable consumers. Which instance gets a message is the server's
// choice, so the check that the replicas share a durable does not rest on
// it: during the load the test freezes the instances that processed events
// until another one has too (shareOut).
func TestReplicas(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{replicas: map[string]int{"payment": 3, "inventory": 2}}, scaled(600))
	err := d.run(t.Context(), func(ctx context.Context) error {
		for _, kind := range []string{"payment", "inventory"} {
			if err := sys.shareOut(ctx, kind, 2*time.Minute); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{exactCounts: true})
	for _, kind := range []string{"payment", "inventory"} {
		var busy []string
		for _, s := range sys.instances(kind) {
			if n := s.counters().total("processed"); n > 0 {
				busy = append(busy, fmt.Sprintf("%s=%d", s.name, n))
			}
		}
		t.Logf("%s instances that processed events: %s", kind, strings.Join(busy, " "))
		if len(busy) < 2 {
			t.Errorf("e2e: only %d %s instances processed events; the replicas did not share the durables", len(busy), kind)
		}
	}
}

// busyInstances are the instances of kind that processed events so far.
func (sys *system) busyInstances(kind string) []*service {
	var busy []*service
	for _, s := range sys.instances(kind) {
		if s.counters().total("processed") > 0 {
			busy = append(busy, s)
		}
	}
	return busy
}

// shareOut makes two instances of kind process events, whichever the
// server hands its messages to: once one has, those that have are frozen
// (SIGSTOP) until another one has too, then thawed. A frozen instance's
// unacknowledged messages go to the others after the ack wait, and its
// transactions hold their locks meanwhile: faults the saga must absorb.
func (sys *system) shareOut(ctx context.Context, kind string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	await := func(n int) error {
		for len(sys.busyInstances(kind)) < n {
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return fmt.Errorf("%d %s instances processed events, want %d: %w", len(sys.busyInstances(kind)), kind, n, ctx.Err())
			}
		}
		return nil
	}
	if err := await(1); err != nil {
		return err
	}
	frozen := sys.busyInstances(kind)
	if len(frozen) >= 2 {
		return nil
	}
	for _, s := range frozen {
		s.signal(syscall.SIGSTOP)
	}
	defer func() {
		for _, s := range frozen {
			s.signal(syscall.SIGCONT)
		}
	}()
	sys.faults.add("frozen_until_another_processed:"+kind, int64(len(frozen)))
	return await(len(frozen) + 1)
}

// TestCrash kills a random service with SIGKILL every one to two and a half
// seconds during the load, and a supervisor restarts it a moment later; the
// payment service also kills itself right after an inbox commit and before
// the ack, with a probability of 1% per event.
func TestCrash(t *testing.T) {
	t.Parallel()
	const minKills, minSelfKills = 6, 2
	sys, d := scenario(t, deployment{
		restart: true,
		env:     map[string][]string{"payment": {"ONCEFLOW_FAULT_KILL_AFTER_COMMIT=0.01"}},
	}, scaled(400))
	err := d.run(t.Context(), func(ctx context.Context) error {
		return sys.chaos(ctx, func() bool {
			return sys.faults.total() >= minKills && sys.selfKills() >= minSelfKills && len(d.placedOrders()) >= d.w.orders
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{})
}

// TestBrokerRestart kills nats-server with SIGKILL twice during the load and
// starts it again on the same JetStream store.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(400))
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 2 {
			if err := d.awaitOrders(ctx, 100+200*i); err != nil {
				return err
			}
			if err := sys.nats.kill(); err != nil {
				return err
			}
			sleepCtx(ctx, jitter(time.Second, 2*time.Second))
			if err := sys.nats.start(ctx); err != nil {
				return err
			}
			sys.faults.add("nats_kill_9_restart", 1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{exactCounts: true})
}

// TestDatabaseRestart restarts PostgreSQL twice during the load (or, on a
// server the suite cannot restart, terminates every backend of the four
// databases). It is the one scenario that does not run in parallel with the
// others: the server is theirs too.
func TestDatabaseRestart(t *testing.T) {
	sys, d := scenario(t, deployment{}, scaled(400))
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 2 {
			if err := d.awaitOrders(ctx, 100+200*i); err != nil {
				return err
			}
			how, err := sys.pg.outage(ctx, sys.databases(), false)
			if err != nil {
				return err
			}
			sys.faults.add("postgres_"+how, 1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{})
}

// TestSlowHandler makes the payment handlers slower than the ack wait: the
// consumers' AckWait is cut to one second (CONSUMER_ACK_WAIT, given to
// every service alike, since each provisions the whole topology) while
// payment's database connections get 600ms of latency, so a batch (two
// round trips) takes over a second and its messages are redelivered to
// other workers, under load. Every connection is slowed: with half of them
// slowed, a run could see no redelivery at all (the pool can keep handing
// out the fast ones). The duplicate the test requires does not rest on
// timing: the latency is a floor, so every OrderPlaced payment handles
// while it lasts (the load goes on throughout) takes longer than the ack
// wait and is redelivered, and a redelivery is dropped as a duplicate
// whether its claim arrives after the first attempt committed or while it
// runs (then it waits for it). Which of the two happens is up to timing
// here; inbox.TestARedeliveryWaitsForTheAttemptStillRunning makes them
// meet every time.
func TestSlowHandler(t *testing.T) {
	t.Parallel()
	sys := newSystem(t)
	px := newToxics()
	pg := px.proxy(t, "payment-pg", sys.pg.addr())
	env := map[string][]string{}
	for _, kind := range kinds {
		env[kind] = []string{"CONSUMER_ACK_WAIT=1s"}
	}
	env["payment"] = append(env["payment"], "CONSUMER_WORKERS=4")
	d := startDriver(t, sys, deployment{
		databaseAddr: map[string]string{"payment": pg.addr()},
		env:          env,
	}, scaled(300))
	for _, durable := range []string{streams.PaymentOrders, streams.PaymentInventory} {
		info, err := sys.consumerInfo(t.Context(), streamOfDurable(durable), durable)
		if err != nil {
			t.Fatalf("e2e: %v", err)
		}
		if info.Config.AckWait != time.Second {
			t.Fatalf("e2e: %s's AckWait is %s: CONSUMER_ACK_WAIT=1s did not reach it", durable, info.Config.AckWait)
		}
	}
	err := d.run(t.Context(), func(ctx context.Context) error {
		sys.faults.add("latency_600ms_on_payment_pg_links", 1)
		sys.faults.add("ack_wait_1s", int64(len(streams.Saga(streams.Config{}).Consumers)))
		return pg.apply(ctx, toxic{kind: "latency", stream: "downstream", toxicity: 1, attributes: `{"latency":600,"jitter":50}`}, 8*time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{exactCounts: true})
	m := sys.counters()
	t.Logf("slow handler: payment-orders duplicates=%v", m[metricKey{streams.PaymentOrders, "duplicate"}])
	if m[metricKey{streams.PaymentOrders, "duplicate"}] == 0 {
		t.Errorf("e2e: no redelivery of OrderPlaced was dropped as a duplicate: the handler never outlasted the ack wait")
	}
}

// streamOfDurable is the stream a durable of the saga reads.
func streamOfDurable(durable string) string {
	for _, c := range streams.Saga(streams.Config{}).Consumers {
		if c.Durable == durable {
			return c.Stream
		}
	}
	return ""
}

// TestPoison publishes malformed, unknown-type, invalid, ancient and orphaned
// messages on every stream during the load: each lands in the DLQ with its
// reason, once per durable that receives it, and everything else completes.
func TestPoison(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(400))
	poison := poisonMessages()
	var want int64
	err := d.run(t.Context(), func(ctx context.Context) (err error) {
		want, err = sys.publishPoison(ctx, d, poison)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{dlq: want, exactCounts: true})

	reasons, err := sys.dlqReasons(t.Context())
	if err != nil {
		t.Fatalf("e2e: read the DLQ: %v", err)
	}
	var all []string
	for durable, rs := range reasons {
		for _, r := range rs {
			if r == "" {
				t.Errorf("e2e: a DLQ entry of %s has no reason", durable)
			}
			all = append(all, durable+": "+r)
		}
	}
	joined := strings.Join(all, "\n")
	for _, p := range poison {
		if !strings.Contains(joined, p.reason) {
			t.Errorf("e2e: no DLQ reason mentions %q (poison %q); reasons:\n%s", p.reason, p.name, joined)
		}
	}
	t.Logf("DLQ reasons:\n%s", joined)
}

// TestNetworkFaults puts toxiproxy between payment and inventory and their
// database, and between order and payment and NATS, and during the load
// adds latency, stalls that end in a closed connection, and resets, one
// after the other, so that time-outs fire mid-transaction and mid-publish.
func TestNetworkFaults(t *testing.T) {
	t.Parallel()
	sys := newSystem(t)
	px := newToxics()
	paymentPG := px.proxy(t, "payment-pg", sys.pg.addr())
	inventoryPG := px.proxy(t, "inventory-pg", sys.pg.addr())
	orderNATS := px.proxy(t, "order-nats", sys.nats.addr())
	paymentNATS := px.proxy(t, "payment-nats", sys.nats.addr())
	d := startDriver(t, sys, deployment{
		databaseAddr: map[string]string{"payment": paymentPG.addr(), "inventory": inventoryPG.addr()},
		natsAddr:     map[string]string{"order": orderNATS.addr(), "payment": paymentNATS.addr()},
	}, scaled(400))
	schedule := []struct {
		name  string
		proxy *toxicProxy
		toxic toxic
		lasts time.Duration
	}{
		{"latency:payment-pg", paymentPG, toxic{"latency", "downstream", 1, `{"latency":200,"jitter":100}`}, 3 * time.Second},
		{"stall_then_close:inventory-pg", inventoryPG, toxic{"timeout", "upstream", 1, `{"timeout":2000}`}, 2500 * time.Millisecond},
		{"reset:payment-pg", paymentPG, toxic{"reset_peer", "upstream", 1, `{"timeout":0}`}, time.Second},
		{"latency:order-nats", orderNATS, toxic{"latency", "downstream", 1, `{"latency":1500}`}, 3 * time.Second},
		{"reset:order-nats", orderNATS, toxic{"reset_peer", "upstream", 1, `{"timeout":0}`}, time.Second},
		{"stall_then_close:payment-nats", paymentNATS, toxic{"timeout", "upstream", 1, `{"timeout":1500}`}, 2 * time.Second},
		{"reset_half:inventory-pg", inventoryPG, toxic{"reset_peer", "downstream", 0.5, `{"timeout":50}`}, time.Second},
	}
	err := d.run(t.Context(), func(ctx context.Context) error {
		if err := d.awaitOrders(ctx, 50); err != nil {
			return err
		}
		for _, s := range schedule {
			if err := s.proxy.apply(ctx, s.toxic, s.lasts); err != nil {
				return err
			}
			sys.faults.add(s.name, 1)
			sleepCtx(ctx, 500*time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{})
}

// TestSeveredConnections severs and starves the services' database
// connections during the load: the outbox relays' LISTEN sessions are
// killed (they must poll meanwhile and listen again); long transactions
// hold the locks that every write of order, payment and inventory needs, so
// that their pools fill with waiting transactions; and order's and
// payment's connections are cut the moment they send COMMIT, which the
// server then executes: commits whose outcome the service cannot know.
func TestSeveredConnections(t *testing.T) {
	t.Parallel()
	const cutsPerService = 6
	sys := newSystem(t)
	orderPG := newCommitCutter(t, sys.pg.addr())
	paymentPG := newCommitCutter(t, sys.pg.addr())
	d := startDriver(t, sys, deployment{
		databaseAddr: map[string]string{"order": orderPG.addr(), "payment": paymentPG.addr()},
	}, scaled(400))
	err := d.run(t.Context(), func(ctx context.Context) error {
		if err := d.awaitOrders(ctx, 50); err != nil {
			return err
		}
		for range 2 {
			if err := sys.severListens(ctx); err != nil {
				return err
			}
			sleepCtx(ctx, time.Second)
		}

		locks := []struct {
			kind, lock string
			request    func(ctx context.Context, i int) error
		}{
			{"order", "LOCK TABLE orders IN EXCLUSIVE MODE", func(ctx context.Context, _ int) error {
				return d.placeNext(ctx)
			}},
			{"payment", "LOCK TABLE wallets IN EXCLUSIVE MODE", func(ctx context.Context, i int) error {
				return d.credit(ctx, 0, "rich-00", 100, fmt.Sprintf("%s-pressure-%d", d.prefix, i))
			}},
			{"inventory", "LOCK TABLE stock IN EXCLUSIVE MODE", func(ctx context.Context, i int) error {
				return d.setStock(ctx, fmt.Sprintf("pressure-%d", i), 5)
			}},
		}
		g, gctx := errgroup.WithContext(ctx)
		for _, l := range locks {
			g.Go(func() error {
				starved, err := sys.holdLock(gctx, l.kind, l.lock, 5*time.Second, l.request)
				if starved {
					sys.faults.add("pool_starved:"+l.kind, 1)
				}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}

		orderPG.arm(cutsPerService)
		paymentPG.arm(cutsPerService)
		deadline := time.Now().Add(time.Minute)
		for orderPG.cuts.Load() < cutsPerService || paymentPG.cuts.Load() < cutsPerService {
			if time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) {
				return fmt.Errorf("commits cut: order %d, payment %d, want %d each", orderPG.cuts.Load(), paymentPG.cuts.Load(), cutsPerService)
			}
		}
		sys.faults.add("commit_cut:order", orderPG.cuts.Load())
		sys.faults.add("commit_cut:payment", paymentPG.cuts.Load())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"order", "payment", "inventory"} {
		if sys.faults.count("pool_starved:"+kind) == 0 {
			t.Errorf("e2e: %s's /readyz never failed while its lock was held: its pool was not starved", kind)
		}
	}
	sys.verify(d, expect{})
}

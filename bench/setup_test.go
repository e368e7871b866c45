package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) {
	code := testenv.Run(m)
	// The durable clusters are stopped by the benchmarks that started them;
	// their data directory outlives each of them so that initdb runs once.
	if err := os.RemoveAll(durableDir()); err != nil && code == 0 {
		fmt.Fprintf(os.Stderr, "bench: remove %s: %v\n", durableDir(), err)
		code = 1
	}
	os.Exit(code)
}

// durableDir holds the durable cluster of this test binary.
func durableDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("onceflow-bench-pg-%d", os.Getpid()))
}

// quiet is the logger of the components under measurement: logging is not
// what is measured.
var quiet = slog.New(slog.DiscardHandler)

const (
	// wallets is how many wallets the events spread over: enough that
	// concurrent transactions rarely wait for each other's rows.
	wallets = 1000
	// batchSize is the events per transaction of the batched forms, the
	// consumers' batch size.
	batchSize = 100
)

// pgTarget is a PostgreSQL server the benchmarks run on.
type pgTarget struct {
	name  string // "fast" (fsync off) or "durable"
	newDB func(b testing.TB, schema postgres.Schema) *pgxpool.Pool
}

// pgTargets returns the test environment's server (fsync and synchronous
// commit off) and a durable local cluster, started on first use and stopped
// when top ends.
func pgTargets(top *testing.B) []pgTarget {
	d := &durableServer{}
	top.Cleanup(d.stop)
	return []pgTarget{
		{name: "fast", newDB: func(b testing.TB, schema postgres.Schema) *pgxpool.Pool {
			return testenv.NewDatabase(b, schema).Pool
		}},
		{name: "durable", newDB: d.newDB},
	}
}

// durableServer is a local cluster with PostgreSQL's crash-safe defaults:
// fsync, synchronous_commit and full_page_writes on.
type durableServer struct {
	once    sync.Once
	cluster *localpg.Cluster
	admin   *pgxpool.Pool
	err     error
	seq     atomic.Int64

	mu        sync.Mutex
	templates map[string]bool
}

func (d *durableServer) start() error {
	d.once.Do(func() {
		ctx := context.Background()
		if err := os.MkdirAll(durableDir(), 0o755); err != nil { // the postgres user must traverse it
			d.err = err
			return
		}
		if d.cluster, d.err = localpg.Start(ctx, localpg.Config{Dir: durableDir(), Durable: true}, quiet); d.err != nil {
			return
		}
		d.admin, d.err = postgres.Connect(ctx, d.cluster.URL("postgres"))
	})
	return d.err
}

func (d *durableServer) stop() {
	if d.admin != nil {
		d.admin.Close()
	}
	if d.cluster != nil {
		if err := d.cluster.Stop(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "bench: stop durable cluster: %v\n", err)
		}
	}
}

// newDB returns a pool on a new database migrated to schema, dropped when b
// ends.
func (d *durableServer) newDB(b testing.TB, schema postgres.Schema) *pgxpool.Pool {
	b.Helper()
	require.NoError(b, d.start())
	ctx := context.Background()
	tmpl := "tmpl_" + strings.ReplaceAll(schema.Key(), "+", "_")
	d.mu.Lock()
	if !d.templates[tmpl] {
		var exists bool
		err := d.admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, tmpl).Scan(&exists)
		require.NoError(b, err)
		if !exists {
			_, err = d.admin.Exec(ctx, "CREATE DATABASE "+tmpl)
			require.NoError(b, err)
			pool, err := postgres.Connect(ctx, d.cluster.URL(tmpl))
			require.NoError(b, err)
			err = postgres.Migrate(ctx, pool, schema, quiet)
			pool.Close()
			require.NoError(b, err)
		}
		if d.templates == nil {
			d.templates = map[string]bool{}
		}
		d.templates[tmpl] = true
	}
	d.mu.Unlock()

	name := fmt.Sprintf("bench_%d", d.seq.Add(1))
	_, err := d.admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tmpl)
	require.NoError(b, err)
	pool, err := postgres.Connect(ctx, d.cluster.URL(name))
	require.NoError(b, err)
	b.Cleanup(func() {
		pool.Close()
		if _, err := d.admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			b.Errorf("drop %s: %v", name, err)
		}
	})
	return pool
}

// schemaOf is the migrated schema of a service database.
func schemaOf(b testing.TB, service string) postgres.Schema {
	b.Helper()
	schema, err := postgres.ServiceSchema(service)
	require.NoError(b, err)
	return schema
}

// seedWallets credits wallets w0000 … with a balance no benchmark exhausts.
func seedWallets(b testing.TB, pool *pgxpool.Pool) {
	b.Helper()
	_, err := pool.Exec(context.Background(),
		`INSERT INTO wallets (customer_id, balance_cents)
		 SELECT format('w%s', lpad(i::text, 4, '0')), 1000000000000 FROM generate_series(0, $1 - 1) AS i`, wallets)
	require.NoError(b, err)
}

// walletsDB returns a pool on a new payment database whose wallets are
// seeded (seedWallets): where the benchmarks' debits go.
func (pg pgTarget) walletsDB(b testing.TB) *pgxpool.Pool {
	b.Helper()
	pool := pg.newDB(b, schemaOf(b, "payment"))
	seedWallets(b, pool)
	return pool
}

// debit is one event's worth of the benchmarks' business write.
type debit struct {
	ev       event.Envelope
	customer string
	amount   int64
}

// orderEvents returns n OrderPlaced events of random wallets and amounts.
func orderEvents(b testing.TB, n int) []debit {
	b.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	ds := make([]debit, n)
	for i := range ds {
		customer, amount := fmt.Sprintf("w%04d", rng.IntN(wallets)), 1+rng.Int64N(1000)
		orderID := uuid.Must(uuid.NewV7())
		ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
			Order:      event.Order{OrderID: orderID, CustomerID: customer, CustomerEmail: customer + "@example.com"},
			Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: amount}},
			TotalCents: amount,
		})
		require.NoError(b, err)
		ds[i] = debit{ev: ev, customer: customer, amount: amount}
	}
	return ds
}

// envelopes returns the events of ds.
func envelopes(ds []debit) []event.Envelope {
	evs := make([]event.Envelope, len(ds))
	for i, d := range ds {
		evs[i] = d.ev
	}
	return evs
}

// newJetStream returns a JetStream client of the test environment's NATS
// server (embedded, with its default fsync interval of two minutes).
func newJetStream(b testing.TB) jetstream.JetStream {
	b.Helper()
	js, err := jetstream.New(testenv.NewNATS(b).Conn(b), jetstream.WithPublishAsyncTimeout(30*time.Second))
	require.NoError(b, err)
	return js
}

// publishAll publishes msgs asynchronously and waits for every ack.
func publishAll(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) error {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, msg := range msgs {
		for {
			f, err := js.PublishMsgAsync(msg)
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				<-js.PublishAsyncComplete()
				continue
			}
			if err != nil {
				return err
			}
			futures = append(futures, f)
			break
		}
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// messages returns the NATS messages of evs.
func messages(b testing.TB, evs []event.Envelope) []*nats.Msg {
	b.Helper()
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		msg, err := ev.Msg()
		require.NoError(b, err)
		msgs[i] = msg
	}
	return msgs
}

// measurement is the timed part of a benchmark: its wall time, b's timer,
// and the CPU time the whole machine and this process spent meanwhile.
type measurement struct {
	b                  *testing.B
	start, end         cpuTimes
	selfStart, selfEnd time.Duration
}

// measure resets b's timer and starts a measurement.
func measure(b *testing.B) *measurement {
	b.ResetTimer()
	return &measurement{b: b, start: readCPUTimes(), selfStart: selfCPU()}
}

// stop stops b's timer and the measurement.
func (m *measurement) stop() {
	m.b.StopTimer()
	m.end, m.selfEnd = readCPUTimes(), selfCPU()
}

// report reports the events per second of the measurement and the CPU time
// per event of the whole machine: PostgreSQL, NATS and the code measured,
// everything this benchmark makes work. cores × 10⁶ / cpu-us/event is the
// rate the machine would reach with every core busy, which tells a
// benchmark that waits (on round trips, locks, fsyncs) from one the
// machine cannot run faster.
//
// It reports too the share of that CPU time this process spent: the code
// measured, the benchmark's own driving and the embedded NATS server. The
// rest is PostgreSQL's (and whatever else ran on the machine), which tells
// which side a benchmark's CPU time should be cut on.
func (m *measurement) report(events int) {
	m.b.ReportMetric(float64(events)/m.b.Elapsed().Seconds(), "events/s")
	if busy, ok := m.end.busySince(m.start, m.b.Elapsed()); ok {
		m.b.ReportMetric(busy.Seconds()*1e6/float64(events), "cpu-us/event")
		if self := m.selfEnd - m.selfStart; busy > 0 && self > 0 {
			m.b.ReportMetric(min(1, self.Seconds()/busy.Seconds()), "self-share")
		}
	}
}

// selfCPU is the CPU time this process has spent, user and system; 0 where
// the system does not say.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuTimes is what /proc/stat says of the CPUs: the clock ticks they all
// spent busy and in all, and how many there are. ok is false where there is
// no /proc/stat.
type cpuTimes struct {
	busy, total int64
	cpus        int
	ok          bool
}

func readCPUTimes() cpuTimes {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	return parseCPUTimes(string(data))
}

// parseCPUTimes reads the lines of /proc/stat that start with "cpu": the
// first sums every CPU's ticks, one line follows per CPU.
func parseCPUTimes(stat string) cpuTimes {
	var t cpuTimes
	for i, line := range strings.Split(stat, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if i > 0 {
			t.cpus++ // cpu0, cpu1, …
			continue
		}
		// user nice system idle iowait irq softirq steal (guest time is
		// in user already)
		for j, f := range fields[1:min(len(fields), 9)] {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return cpuTimes{}
			}
			t.total += n
			// Not idle, not waiting for I/O, and not stolen: steal is
			// time the hypervisor ran another machine on this one's CPUs.
			if j != 3 && j != 4 && j != 7 {
				t.busy += n
			}
		}
	}
	t.ok = t.cpus > 0
	return t
}

// busySince is the CPU time spent busy between from and t, which lie wall
// apart: the busy share of the ticks (so no tick rate need be known) times
// the CPU time there was.
func (t cpuTimes) busySince(from cpuTimes, wall time.Duration) (time.Duration, bool) {
	total := t.total - from.total
	if !t.ok || !from.ok || total <= 0 {
		return 0, false
	}
	share := float64(t.busy-from.busy) / float64(total)
	return time.Duration(share * float64(wall) * float64(t.cpus)), true
}

func TestCPUTimesMeasureTheBusyShareOfAllCPUs(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	before := parseCPUTimes("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\ncpu1 50 0 25 400 25 0 0 0 0 0\nintr 1\n")
	after := parseCPUTimes("cpu  250 0 100 870 50 0 0 30 7 0\ncpu0 125 0 50 435 25 0 0 15 0 0\ncpu1 125 0 50 435 25 0 0 15 7 0\nintr 2\n")
	require.True(t, before.ok)
	require.Equal(t, 2, before.cpus)

	// 200 of the 300 ticks since were busy (guest time is counted in user
	// already, and the 30 stolen by the hypervisor were not this
	// machine's): two thirds of two CPUs for a second.
	busy, ok := after.busySince(before, time.Second)
	require.True(t, ok)
	require.InDelta(t, (4 * time.Second / 3).Seconds(), busy.Seconds(), 1e-9)

	_, ok = after.busySince(cpuTimes{}, time.Second)
	require.False(t, ok, "no /proc/stat, no figure")
}

// drive processes items in chunks of n from conns goroutines until all are
// done, timing only that, and reports events/s.
func drive[T any](b *testing.B, conns, n int, items []T, do func(ctx context.Context, chunk []T) error) {
	b.Helper()
	var next atomic.Int64
	m := measure(b)
	g, ctx := errgroup.WithContext(context.Background())
	for range conns {
		g.Go(func() error {
			for {
				end := int(next.Add(int64(n)))
				start := end - n
				if start >= len(items) {
					return nil
				}
				if err := do(ctx, items[start:min(end, len(items))]); err != nil {
					return err
				}
			}
		})
	}
	err := g.Wait()
	m.stop()
	require.NoError(b, err)
	m.report(len(items))
}

// inTx runs f in a transaction of pool and commits it.
func inTx(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// awaitCount polls count until it reaches n, the end of a timed consumer
// run. A millisecond between polls is a thousandth of a one-second run and
// keeps most of the polling's own CPU time out of the run's cpu-us/event.
func awaitCount(b testing.TB, n int64, count func() int64) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for count() < n {
		if time.Now().After(deadline) {
			b.Fatalf("processed %d of %d events in 10 minutes", count(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// kinds are the four services, in the saga's order.
var kinds = []string{"order", "payment", "inventory", "notify"}

// databaseSeq numbers the databases of this test binary, so that the runs
// of -count=N and other binaries on a shared server never collide.
var databaseSeq atomic.Int64

// system is one scenario's deployment: four databases, a NATS server and the
// service processes, with what the scenario did to them.
type system struct {
	t       *testing.T
	dir     string
	pg      *pgServer
	dbNames map[string]string        // by kind
	pools   map[string]*pgxpool.Pool // by kind, straight to the server
	nats    *natsServer              // the one server; nil on a cluster
	cluster *natsCluster             // the three nodes; nil with one server
	// natsURL is what the services and the auditor connect to: the
	// server's URL, or the cluster's three.
	natsURL string
	// authConf is natsauth's server configuration, which every NATS server
	// of the scenario includes; creds are the credentials files by identity:
	// one per service, the provisioner's, the operator's and the harness's.
	authConf string
	creds    map[string]string
	js       jetstream.JetStream
	faults   *faults
	// observed counts what a scenario saw happen, as evidence that its
	// fault met what it aimed at (events published again, transactions open
	// at a crash, …); the figures line shows it apart from the faults.
	observed *faults
	began    time.Time

	services []*service
	byKind   map[string][]*service

	// issuer is the scenario's token issuer, served at issuerURL, whose
	// JWKS the services fetch like any identity provider's.
	issuer    *auth.Issuer
	issuerURL string

	stopScrape func()
}

// newSystem creates the scenario's databases and starts its NATS server.
// The services start with start.
func newSystem(t *testing.T) *system {
	t.Helper()
	return newSystemWith(t, startOneNATS)
}

// startOneNATS starts the scenario's NATS server, a single one.
func startOneNATS(sys *system) {
	t := sys.t
	ports := testenv.FreePorts(t, 2)
	n, err := startNATS(t.Context(), shared.natsBin, sys.dir, sys.authConf, ports[0], ports[1])
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	t.Cleanup(n.stop)
	sys.nats, sys.natsURL = n, n.url()
}

// newSystemWith is newSystem with the broker started by startBroker, which
// sets sys.natsURL.
func newSystemWith(t *testing.T, startBroker func(sys *system)) *system {
	t.Helper()
	return newSystemOn(t, shared.pg, startBroker)
}

// newSystemOn is newSystemWith with the four databases on pg instead of
// the suite's server.
func newSystemOn(t *testing.T, pg *pgServer, startBroker func(sys *system)) *system {
	t.Helper()
	shared.trackSources(t)
	ctx := t.Context()
	sys := &system{
		t:        t,
		dir:      t.TempDir(),
		pg:       pg,
		dbNames:  map[string]string{},
		pools:    map[string]*pgxpool.Pool{},
		faults:   newFaults(),
		observed: newFaults(),
		began:    time.Now(),
		byKind:   map[string][]*service{},
	}
	seq := databaseSeq.Add(1)
	for _, kind := range kinds {
		name := fmt.Sprintf("e2e_%d_%d_%s", os.Getpid(), seq, kind)
		if err := sys.pg.createDatabase(ctx, name); err != nil {
			t.Fatal(err)
		}
		sys.dbNames[kind] = name
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, name := range sys.dbNames {
			if err := sys.pg.dropDatabase(ctx, name); err != nil {
				t.Errorf("e2e: %v", err)
			}
		}
	})
	// Registered before the processes' clean-ups, so it runs after them,
	// when the logs are complete.
	t.Cleanup(func() {
		if t.Failed() {
			sys.dumpLogs()
		}
	})
	for _, kind := range kinds {
		pool, err := pgxpool.New(ctx, sys.pg.url(sys.dbNames[kind]))
		if err != nil {
			t.Fatalf("e2e: pool on %s: %v", kind, err)
		}
		sys.pools[kind] = pool
		t.Cleanup(pool.Close)
	}

	sys.issuer, sys.issuerURL = apptest.StartIssuer(t)

	authority, err := natsauth.New()
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if sys.authConf, err = authority.ServerConfig(); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if sys.creds, err = authority.WriteCreds(filepath.Join(sys.dir, "creds"), streams.Saga(streams.Config{}), natsauth.Admin); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	startBroker(sys)
	nc, err := nats.Connect(sys.natsURL, append(sys.natsClient(natsauth.Admin).Options(natsauth.Admin),
		nats.Name("e2e"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatalf("e2e: connect to nats: %v", err)
	}
	t.Cleanup(nc.Close)
	if sys.js, err = jetstream.New(nc); err != nil {
		t.Fatalf("e2e: jetstream: %v", err)
	}
	return sys
}

// natsClient is how identity connects to the scenario's NATS server.
func (sys *system) natsClient(identity string) natsauth.Client {
	return natsauth.Client{URL: sys.natsURL, Creds: sys.creds[identity]}
}

// provision runs `onceflow provision` with the provisioner's credentials,
// as the compose demo's one-shot job does, with the services' extra
// environment (the durables' settings are provisioning's).
func (sys *system) provision(d deployment) {
	t := sys.t
	t.Helper()
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"NATS_URL=" + sys.natsURL,
		"NATS_CREDS=" + sys.creds[streams.Provisioner],
	}
	for _, kind := range kinds {
		env = append(env, d.env[kind]...)
	}
	p, err := startProcess(shared.onceflowBin, []string{"provision", "--wait", "2m"}, env, filepath.Join(sys.dir, "provision.log"))
	if err != nil {
		t.Fatalf("e2e: onceflow provision: %v", err)
	}
	<-p.done
	if p.err != nil {
		t.Fatalf("e2e: onceflow provision: %v; log:\n%s", p.err, tailFile(filepath.Join(sys.dir, "provision.log"), 20))
	}
}

// deployment is how the services of a scenario run.
type deployment struct {
	// replicas is the number of instances per kind; default 1.
	replicas map[string]int
	// env is extra environment per kind.
	env map[string][]string
	// restart has a supervisor restart a service that died, after a moment.
	// Without it, a service that exits fails the scenario.
	restart bool
	// databaseAddr and natsAddr, per kind, reach PostgreSQL and NATS through
	// another address than theirs, e.g. a fault-injecting proxy.
	databaseAddr map[string]string
	natsAddr     map[string]string
}

// start provisions the streams and starts the services, and returns once
// every instance is ready.
func (sys *system) start(d deployment) {
	t := sys.t
	t.Helper()
	sys.provision(d)
	n := 0
	for _, kind := range kinds {
		n += max(1, d.replicas[kind])
	}
	ports := testenv.FreePorts(t, n)
	for _, kind := range kinds {
		for i := range max(1, d.replicas[kind]) {
			port := ports[0]
			ports = ports[1:]
			name := kind
			if i > 0 {
				name = fmt.Sprintf("%s#%d", kind, i+1)
			}
			dbURL := sys.pg.url(sys.dbNames[kind])
			if addr := d.databaseAddr[kind]; addr != "" {
				dbURL = sys.pg.urlVia(sys.dbNames[kind], addr)
			}
			natsURL := sys.natsURL
			if addr := d.natsAddr[kind]; addr != "" {
				natsURL = "nats://" + addr
			}
			env := []string{
				"PATH=" + os.Getenv("PATH"),
				"DATABASE_URL=" + dbURL,
				"NATS_URL=" + natsURL,
				"NATS_CREDS=" + sys.creds[kind],
				fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port),
				"LOG_LEVEL=info",
				"SHUTDOWN_TIMEOUT=20s",
				"AUTH_JWKS_URL=" + sys.issuerURL + auth.JWKSPath,
				"AUTH_ISSUER=" + sys.issuerURL,
				// Partitions of five seconds: every scenario's events and
				// outbox rows cross partition boundaries, and the
				// maintenance creates partitions while faults strike.
				"INBOX_PARTITION_INTERVAL=5s",
				"OUTBOX_PARTITION_INTERVAL=5s",
				"INBOX_MAX_SKEW=10s",
			}
			s := &service{
				kind:    kind,
				name:    name,
				addr:    fmt.Sprintf("127.0.0.1:%d", port),
				bin:     shared.onceflowBin,
				env:     append(env, d.env[kind]...),
				logPath: filepath.Join(sys.dir, strings.ReplaceAll(name, "#", "-")+".log"),
				restart: d.restart,
			}
			sys.services = append(sys.services, s)
			sys.byKind[kind] = append(sys.byKind[kind], s)
		}
	}
	t.Cleanup(sys.stopServices)

	g, ctx := errgroup.WithContext(t.Context())
	for _, s := range sys.services {
		g.Go(func() error { return s.start(ctx) })
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("e2e: %v", err)
	}

	scrapeCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		ticker := time.NewTicker(500 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-scrapeCtx.Done():
				return
			case <-ticker.C:
				for _, s := range sys.services {
					s.scrape(scrapeCtx)
				}
			}
		}
	})
	sys.stopScrape = func() { cancel(); wg.Wait() }
}

// stopServices stops every instance gracefully; one that does not stop
// cleanly fails the scenario.
func (sys *system) stopServices() {
	if sys.stopScrape != nil {
		sys.stopScrape()
	}
	var wg sync.WaitGroup
	for _, s := range sys.services {
		wg.Go(func() {
			if err := s.stop(); err != nil {
				sys.t.Errorf("e2e: graceful stop: %v", err)
			}
		})
	}
	wg.Wait()
}

// instances returns the instances of kind.
func (sys *system) instances(kind string) []*service { return sys.byKind[kind] }

// url is the base URL of the first instance of kind.
func (sys *system) url(kind string) string { return sys.byKind[kind][0].url() }

// token is a token of the scenario's issuer for r.
func (sys *system) token(r auth.TokenRequest) string {
	tok, err := sys.issuer.Token(r)
	if err != nil {
		sys.t.Fatalf("e2e: %v", err)
	}
	return tok
}

// forgedToken is an operator's token that names the scenario's issuer but
// is signed by another key.
func (sys *system) forgedToken() string {
	forger, err := auth.NewIssuer(sys.t.Context(), auth.IssuerConfig{Issuer: sys.issuerURL})
	if err != nil {
		sys.t.Fatalf("e2e: %v", err)
	}
	tok, err := forger.Token(auth.TokenRequest{Subject: "e2e-operator", Admin: true})
	if err != nil {
		sys.t.Fatalf("e2e: %v", err)
	}
	return tok
}

// dbName is the name of kind's database.
func (sys *system) dbName(kind string) string { return sys.dbNames[kind] }

// databases lists the scenario's database names.
func (sys *system) databases() []string { return slices.Collect(maps.Values(sys.dbNames)) }

// problems reports the services' unexpected exits.
func (sys *system) problems() error {
	var errs []error
	for _, s := range sys.services {
		for _, p := range s.problems() {
			errs = append(errs, errors.New(p))
		}
	}
	return errors.Join(errs...)
}

// counters sums the inbox counters of every instance.
func (sys *system) counters() metrics {
	var m metrics
	for _, s := range sys.services {
		m = m.plus(s.counters())
	}
	return m
}

// waitQuiet waits until every order is settled and nothing is left to do:
// every service up, every outbox row published, every consumer caught up with
// nothing unacknowledged, every e-mail sent — twice in a row, a moment
// apart. It returns what was still going on when timeout passed, and fails
// the test at once if a service exited unexpectedly.
func (sys *system) waitQuiet(timeout time.Duration) error {
	t := sys.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		if err := sys.problems(); err != nil {
			t.Fatalf("e2e: %v", err)
		}
		err := sys.busy(ctx)
		if err == nil && sleepCtx(ctx, 300*time.Millisecond) {
			if err = sys.busy(ctx); err == nil {
				return nil
			}
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("the system did not go quiet within %s: %v", timeout, err)
		}
	}
}

// busy says what is still going on, or nil.
func (sys *system) busy(ctx context.Context) error {
	for _, s := range sys.services {
		if !s.running() {
			return fmt.Errorf("%s is down", s.name)
		}
	}
	for _, c := range streams.Saga(streams.Config{}).Consumers {
		info, err := sys.consumerInfo(ctx, c.Stream, c.Durable)
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("consumer %s: %d pending, %d unacknowledged", c.Durable, info.NumPending, info.NumAckPending)
		}
	}
	for _, kind := range kinds {
		var unsent int
		if err := sys.pools[kind].QueryRow(ctx, `SELECT count(*) FROM outbox_unsent`).Scan(&unsent); err != nil {
			return fmt.Errorf("%s outbox: %w", kind, err)
		}
		if unsent > 0 {
			return fmt.Errorf("%s outbox: %d unsent", kind, unsent)
		}
	}
	var open, pending int
	if err := sys.pools["order"].QueryRow(ctx, `SELECT count(*) FROM orders WHERE status IN ('PENDING', 'PAID')`).Scan(&open); err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	if open > 0 {
		return fmt.Errorf("%d orders not settled", open)
	}
	if err := sys.pools["notify"].QueryRow(ctx, `SELECT count(*) FROM notifications WHERE status = 'PENDING'`).Scan(&pending); err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	if pending > 0 {
		return fmt.Errorf("%d e-mails not sent", pending)
	}
	return nil
}

func (sys *system) consumerInfo(ctx context.Context, stream, durable string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := sys.js.Consumer(ctx, stream, durable)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", durable, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", durable, err)
	}
	return info, nil
}

// redeliveries counts the deliveries beyond the first of every message, over
// every durable: the consumer sequence counts each delivery, the stream holds
// each message once.
func (sys *system) redeliveries(ctx context.Context) (int64, error) {
	var total int64
	for _, c := range streams.Saga(streams.Config{}).Consumers {
		info, err := sys.consumerInfo(ctx, c.Stream, c.Durable)
		if err != nil {
			return 0, err
		}
		msgs, err := sys.streamMessages(ctx, c.Stream, c.FilterSubjects)
		if err != nil {
			return 0, err
		}
		total += max(0, int64(info.Delivered.Consumer)-msgs)
	}
	return total, nil
}

// streamMessages counts the messages of stream on the subjects filters
// match.
func (sys *system) streamMessages(ctx context.Context, stream string, filters []string) (int64, error) {
	s, err := sys.js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	var n int64
	for _, f := range filters {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return 0, fmt.Errorf("stream %s: %w", stream, err)
		}
		for _, count := range info.State.Subjects {
			n += int64(count)
		}
	}
	return n, nil
}

// dumpLogs writes the end of every process's log to the test log.
func (sys *system) dumpLogs() {
	paths, _ := filepath.Glob(filepath.Join(sys.dir, "*.log"))
	sort.Strings(paths)
	for _, p := range paths {
		sys.t.Logf("==== %s (last 80 lines)\n%s", filepath.Base(p), tailFile(p, 80))
	}
}

// tailFile returns the last lines of the file at path.
func tailFile(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// faults counts the faults a scenario injected, by kind.
type faults struct {
	mu sync.Mutex
	n  map[string]int64
}

func newFaults() *faults { return &faults{n: map[string]int64{}} }

func (f *faults) add(kind string, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[kind] += n
}

func (f *faults) count(kind string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[kind]
}

func (f *faults) total() int64 {
	var n int64
	for _, v := range f.snapshot() {
		n += v
	}
	return n
}

func (f *faults) snapshot() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.n)
}

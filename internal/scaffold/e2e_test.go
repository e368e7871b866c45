package scaffold_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/streamscan"
	"github.com/onceflow/onceflow/services/order"
)

// The loyalty service's own code, as its engineer writes it after
// `onceflow new service loyalty --consumes OrderConfirmed`: a points table
// and a query (a new migration, as the recipe says), and the handler's
// effect. The ledger has no unique key on order_id, on purpose: the inbox
// alone must keep it to one award per confirmed order.
const (
	pointsMigration = `-- +goose Up
CREATE TABLE point_awards (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    uuid        NOT NULL,
    customer_id text        NOT NULL,
    points      bigint      NOT NULL CHECK (points >= 0),
    awarded_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE point_awards;
`
	pointsQueries = `-- name: AwardPoints :exec
INSERT INTO point_awards (order_id, customer_id, points)
VALUES (@order_id, @customer_id, @points);
`
	pointsGo = `package loyalty

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/services/loyalty/internal/dbsqlc"
)

// CentsPerPoint is what a customer spends for one loyalty point.
const CentsPerPoint = 100

// awardPoints awards the points of a confirmed order, on the inbox's tx.
func (s *Service) awardPoints(ctx context.Context, tx pgx.Tx, p event.OrderConfirmedV1) error {
	err := s.queries.AwardPoints(ctx, tx, dbsqlc.AwardPointsParams{OrderID: p.OrderID, CustomerID: p.CustomerID, Points: p.TotalCents / CentsPerPoint})
	if err != nil {
		return fmt.Errorf("award points of order %s: %w", p.OrderID, err)
	}
	return nil
}
`
)

// TestNewServiceEndToEnd proves the path of docs/new-service.md: in a copy
// of the repository it scaffolds a fifth service, loyalty, consuming
// OrderConfirmed; adds a points table awarding points per confirmed order;
// runs sqlc, builds, runs the generated tests (the conformance kit among
// them), loads the compose file; runs
// it beside the other four with `onceflow dev`; places orders; and sees the
// points appear once per confirmed order — also after every OrderConfirmed
// is delivered again under a fresh Nats-Msg-Id, past the broker's dedup.
// Then it scaffolds two more (several events on several streams, and none)
// and vets them. The go commands share this process's module and build
// caches.
func TestNewServiceEndToEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds a copy of the repository and runs it with onceflow dev (an e2e system)")
	}
	began := time.Now()
	step := func(what string) func() {
		start := time.Now()
		return func() { t.Logf("%-44s %6.1fs", what, time.Since(start).Seconds()) }
	}
	defer func() { t.Logf("%-44s %6.1fs", "total", time.Since(began).Seconds()) }()

	done := step("copy the repository")
	repo := copyRepo(t)
	done()

	done = step("onceflow new service loyalty")
	out := newService(t, repo, "loyalty", "--consumes", "OrderConfirmed", "--emits", "PointsAwarded")
	done()
	for _, want := range []string{
		"Scaffolded the loyalty service.",
		"  services/loyalty/loyalty.go\n",
		"  services/loyalty/internal/dbsqlc/loyalty.sql.go\n",
		"  db/migrations/loyalty/00001_loyalty.sql\n",
		"  docker-compose.yml ",
		"loyalty-orders on ORDERS:  OrderConfirmed → HandleOrderConfirmed",
		"PointsAwarded on loyalty.points_awarded.v1 (stream LOYALTY)",
		"  internal/event/types.go ",
		"go test ./services/loyalty/",
	} {
		require.Contains(t, out, want)
	}
	t.Logf("onceflow new service loyalty --consumes OrderConfirmed --emits PointsAwarded:\n%s", out)

	// The engineer's edits: a new migration, a query, the handler's effect.
	write(t, repo, "db/migrations/loyalty/00002_points.sql", pointsMigration)
	write(t, repo, "db/queries/loyalty/points.sql", pointsQueries)
	write(t, repo, "services/loyalty/points.go", pointsGo)
	handler := filepath.Join(repo, "services/loyalty/loyalty.go")
	src, err := os.ReadFile(handler)
	require.NoError(t, err)
	emit := "\t// The event out, written on tx too"
	require.Equal(t, 1, strings.Count(string(src), emit), "the starter handler changed; update this test")
	src = []byte(strings.Replace(string(src), emit, "\tif err := s.awardPoints(ctx, tx, p); err != nil {\n\t\treturn err\n\t}\n"+emit, 1))
	require.NoError(t, os.WriteFile(handler, src, 0o644))

	done = step("go tool sqlc generate")
	sqlcGenerate(t, repo)
	done()

	// Built as the Dockerfile and e2e build it: their compiled packages serve.
	done = step("go build ./cmd/onceflow")
	bin := filepath.Join(repo, "bin", "onceflow")
	goCmdEnv(t, repo, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", bin, "./cmd/onceflow")
	done()

	// -race, as make test: the generated tests are checked as the project's
	// are, and reuse the dependencies make test compiled (not -trimpath,
	// which would compile every dependency a second time).
	done = step("go test -race ./services/loyalty/ ./internal/event/")
	out = goCmd(t, repo, "test", "-race", "-count=1", "-v", "./services/loyalty/", "./internal/event/")
	done()
	// The generated test runs the conformance kit on the generated handler
	// with the engineer's edit in it: every property, by name, in each mode.
	for _, property := range []string{
		"--- PASS: TestConformance/loyalty-orders/writes-only-on-its-transaction",
		"--- PASS: TestConformance/loyalty-orders/emits-through-the-outbox",
		"--- PASS: TestConformance/loyalty-orders/reference/crash-between-commit-and-ack",
		"--- PASS: TestConformance/loyalty-orders/batched/duplicate-concurrent",
	} {
		require.Contains(t, out, property)
	}

	requireComposeService(t, repo, "loyalty", 8085) // after the issuer's 8084, as in dev

	done = step("onceflow dev: five services up")
	sys := startDev(t, bin)
	done()
	require.Contains(t, sys.urls, "loyalty")

	done = step("place orders, await points")
	confirmed := map[string]int64{} // order id → points
	for i, total := range []int{3, 7, 11} {
		id := sys.placeOrder(t, fmt.Sprintf("confirm-%d", i), "alice", "apple", total) // at the seeded 120
		sys.requireStatus(t, id, order.StatusConfirmed)
		confirmed[id] = int64(total*120) / 100
	}
	rejected := sys.placeOrder(t, "reject", "bob", "pear", 6)    // 6000 cents; bob has 5000
	cancelled := sys.placeOrder(t, "cancel", "alice", "plum", 1) // plum is sold out
	sys.requireStatus(t, rejected, order.StatusRejected)
	sys.requireStatus(t, cancelled, order.StatusCancelled)

	ctx := t.Context()
	db, err := pgx.Connect(ctx, sys.databases["loyalty"])
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Equal(c, confirmed, awards(ctx, c, db))
	}, 30*time.Second, 50*time.Millisecond, "one award per confirmed order, none for the others")
	// Read as the operator; published again below as the order service,
	// the only identity that may publish its events.
	js, orderJS := sys.jetStream(t, streams.Operator), sys.jetStream(t, "order")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Equal(c, uint64(len(confirmed)), streamMsgs(ctx, c, js, "LOYALTY"))
	}, 30*time.Second, 50*time.Millisecond, "one PointsAwarded published per confirmed order")
	done()

	done = step("deliver every OrderConfirmed again")
	redelivered := republish(t, js, orderJS, "orders.confirmed.v1", len(confirmed))
	require.Len(t, redelivered, len(confirmed))
	awaitConsumed(t, js, streams.Orders, "loyalty-orders")
	done()

	require.Equal(t, confirmed, awards(ctx, t, db), "a duplicate awarded points again")
	require.Equal(t, uint64(len(confirmed)), streamMsgs(ctx, t, js, "LOYALTY"), "a duplicate emitted PointsAwarded again")
	var claimed int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM processed_events WHERE consumer = 'loyalty-orders'`).Scan(&claimed))
	require.Equal(t, len(confirmed), claimed, "one inbox row per event")
	var tally struct {
		Events int64 `json:"events"`
	}
	getJSON(t, sys.tokens["ALICE"], sys.urls["loyalty"]+"/customers/alice", &tally)
	require.Equal(t, int64(len(confirmed)), tally.Events, "the starter tally counts each event once")

	// The auditor covers the new service with the checks every service
	// gets: its outbox, and its durable's every event claimed.
	done = step("onceflow audit: five services")
	audit := exec.Command(bin, "audit", "--wait", "1m")
	audit.Env = append(os.Environ(), "NATS_URL="+sys.natsURL, "NATS_CREDS="+filepath.Join(sys.natsCreds, streams.Operator+".creds"))
	for service, url := range sys.databases {
		audit.Env = append(audit.Env, strings.ToUpper(service)+"_DATABASE_URL="+url)
	}
	report, err := audit.CombinedOutput()
	require.NoError(t, err, "onceflow audit:\n%s", report)
	require.Contains(t, string(report), "loyalty-orders (ORDERS", "the consumers check does not list loyalty's durable:\n%s", report)
	done()

	// The new durable's NATS rights are derived as every other's: its
	// replay subject is the operator's alone (not the order service's,
	// whose orders.> covers it), its dead letters loyalty's alone, and the
	// operator cannot delete it.
	done = step("the new durable's rights on the bus")
	refused := func(what string, err error) {
		t.Helper()
		require.Error(t, err, what)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }
	pctx, cancel := short()
	_, err = orderJS.Publish(pctx, streams.ReplaySubject("orders.confirmed.v1", "loyalty-orders"), []byte("{}"))
	cancel()
	refused("order publishes loyalty-orders' replay subject", err)
	pctx, cancel = short()
	_, err = sys.jetStream(t, "notify").Publish(pctx, streams.DLQSubjectPrefix+"loyalty-orders", []byte("{}"))
	cancel()
	refused("notify writes loyalty-orders' dead letters", err)
	pctx, cancel = short()
	err = js.DeleteConsumer(pctx, streams.Orders, "loyalty-orders")
	cancel()
	refused("the operator deletes loyalty-orders", err)
	_, err = js.Consumer(ctx, streams.Orders, "loyalty-orders")
	require.NoError(t, err, "loyalty-orders is still there")
	done()

	done = step("stop onceflow dev")
	sys.stop(t)
	done()

	// The template's other shapes: several events on several streams, and
	// none.
	done = step("new services probe and bare; go vet")
	newService(t, repo, "probe", "--consumes", "OrderPlaced", "OrderCancelled", "--consumes=PaymentDebited,StockRejected")
	newService(t, repo, "bare")
	goCmd(t, repo, "vet", "-race", "./services/probe/", "./services/bare/", "./internal/registry/")
	done()
}

// newService runs `onceflow new service NAME args...` in repo, in process.
func newService(t *testing.T, repo, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := cli.Run(t.Context(), append([]string{"new", "service", name, "--dir", repo}, args...), &stdout, &stderr)
	require.NoError(t, err, "onceflow new service %s: %s", name, stderr.String())
	return stdout.String()
}

func write(t *testing.T, repo, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(repo, path), []byte(content), 0o644))
}

// devSystem is a running `onceflow dev`.
type devSystem struct {
	cmd       *exec.Cmd
	stopped   bool
	output    *syncBuffer
	waited    chan error
	urls      map[string]string // service → API base URL
	databases map[string]string // service → database URL
	natsURL   string
	natsCreds string            // the directory of this run's credentials
	tokens    map[string]string // ALICE, BOB, ADMIN → the token dev printed
}

// jetStream connects to the system's NATS as identity.
func (sys *devSystem) jetStream(t *testing.T, identity string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(sys.natsURL, nats.UserCredentials(filepath.Join(sys.natsCreds, identity+".creds")),
		nats.CustomInboxPrefix(streams.InboxPrefix(identity)))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// startDev runs `onceflow dev --seed` on free ports and returns once it
// says it is running.
func startDev(t *testing.T, bin string) *devSystem {
	t.Helper()
	cmd := exec.Command(bin, "dev", "--seed", "--http-port", "0", "--nats-port", "0", "--console-port", "0")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv) // without it, dev runs a local cluster
		}
	}
	cmd.Env = append(env, "LOG_LEVEL=warn")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	sys := &devSystem{cmd: cmd, output: &syncBuffer{}, waited: make(chan error, 1), urls: map[string]string{}, databases: map[string]string{}, tokens: map[string]string{}}
	cmd.Stderr = sys.output
	require.NoError(t, cmd.Start())
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			_, _ = sys.output.Write(append(sc.Bytes(), '\n'))
			lines <- sc.Text()
		}
		sys.waited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if !sys.stopped { // the test failed: stop it as Ctrl-C would, so it removes its cluster
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-sys.waited:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-sys.waited
			}
		}
		if t.Failed() {
			t.Logf("onceflow dev:\n%s", sys.output.String())
		}
	})

	timeout := time.After(2 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "onceflow dev exited:\n%s", sys.output.String())
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && strings.HasPrefix(f[1], "http://"):
				sys.urls[f[0]], sys.databases[f[0]] = f[1], f[2]
			case len(f) == 2 && f[0] == "nats":
				sys.natsURL = f[1]
			case strings.HasPrefix(line, "  NATS credentials: "):
				sys.natsCreds = f[2]
			case len(f) == 2 && f[0] == "export":
				name, token, _ := strings.Cut(f[1], "=")
				sys.tokens[name] = token
			case line == "Press Ctrl-C to stop.":
				go func() { // the rest of the output, until exit
					for range lines {
					}
				}()
				return sys
			}
		case <-timeout:
			t.Fatalf("onceflow dev not running after 2 minutes:\n%s", sys.output.String())
		}
	}
}

// stop stops dev as Ctrl-C does and checks that it exits cleanly.
func (s *devSystem) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-s.waited:
		s.stopped = true
		require.NoError(t, err, "onceflow dev:\n%s", s.output.String())
	case <-time.After(time.Minute):
		t.Fatalf("onceflow dev did not stop:\n%s", s.output.String())
	}
	require.Contains(t, s.output.String(), "Stopped; its temporary data is removed.")
}

// placeOrder places an order of one line as customer (alice or bob, whose
// tokens dev printed) and returns its id.
func (s *devSystem) placeOrder(t *testing.T, key, customer, sku string, quantity int) string {
	t.Helper()
	body := fmt.Sprintf(`{"customer_email":"%s@example.com","items":[{"sku":%q,"quantity":%d}]}`, customer, sku, quantity)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.urls["order"]+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.tokens[strings.ToUpper(customer)])
	req.Header.Set("Idempotency-Key", key)
	resp, err := client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", raw)
	var o struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(raw, &o))
	return o.ID
}

func (s *devSystem) requireStatus(t *testing.T, id, want string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var o struct {
			Status string `json:"status"`
		}
		getJSON(c, s.tokens["ADMIN"], s.urls["order"]+"/orders/"+id, &o)
		require.Equal(c, want, o.Status)
	}, 30*time.Second, 50*time.Millisecond, "order %s", id)
}

// awards returns the points awarded per order, failing if an order has
// more than one award.
func awards(ctx context.Context, t require.TestingT, db *pgx.Conn) map[string]int64 {
	rows, err := db.Query(ctx, `SELECT order_id::text, count(*), sum(points) FROM point_awards GROUP BY order_id`)
	require.NoError(t, err)
	got := map[string]int64{}
	for rows.Next() {
		var id string
		var n, points int64
		require.NoError(t, rows.Scan(&id, &n, &points))
		require.Equal(t, int64(1), n, "order %s awarded %d times", id, n)
		got[id] = points
	}
	require.NoError(t, rows.Err())
	return got
}

// republish publishes every message on subject again, as a broker or relay
// that lost track would: with a fresh Nats-Msg-Id, so that JetStream's
// dedup lets it through and only the consumer's inbox can stop it. It
// returns the ids of the events it republished.
func republish(t *testing.T, js, publisher jetstream.JetStream, subject string, n int) []string {
	t.Helper()
	// The operator reads a stream by message get, as every tool does: it
	// may create no consumer.
	st, err := js.Stream(t.Context(), streams.Orders)
	require.NoError(t, err)
	var msgs []*nats.Msg
	err = streamscan.Scan(t.Context(), st, streamscan.Range{Subject: subject}, func(m streamscan.Message) bool {
		msgs = append(msgs, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		return len(msgs) < n
	})
	require.NoError(t, err)
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.Header.Get(event.HeaderID))
		m.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
		_, err := publisher.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	return ids
}

// awaitConsumed waits until durable has acknowledged every message of
// stream published so far.
func awaitConsumed(t *testing.T, js jetstream.JetStream, stream, durable string) {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		cons, err := js.Consumer(t.Context(), stream, durable)
		require.NoError(c, err)
		ci, err := cons.Info(t.Context())
		require.NoError(c, err)
		require.GreaterOrEqual(c, ci.Delivered.Stream, info.State.LastSeq)
		require.Zero(c, ci.NumAckPending)
		require.Zero(c, ci.NumPending)
	}, 30*time.Second, 50*time.Millisecond, "%s did not consume %s", durable, stream)
}

// streamMsgs counts the messages of stream.
func streamMsgs(ctx context.Context, t require.TestingT, js jetstream.JetStream, stream string) uint64 {
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

func getJSON(t require.TestingT, token, url string, out any) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
}

// client keeps no connections, which would outlive the test as goroutines.
func client() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// requireComposeService loads the compose file of repo as `docker compose`
// would and checks the service name in it: the onceflow image running its
// command, on its own database with its own role, published on port.
func requireComposeService(t *testing.T, repo, name string, port uint32) {
	t.Helper()
	opts, err := composecli.NewProjectOptions([]string{filepath.Join(repo, "docker-compose.yml")},
		// The operator secret is required: compose refuses the file without one.
		composecli.WithWorkingDirectory(repo), composecli.WithEnv([]string{"ISSUER_OPERATOR_SECRET=" + rand.Text()}))
	require.NoError(t, err)
	project, err := composecli.ProjectFromOptions(t.Context(), opts)
	require.NoError(t, err, "docker-compose.yml does not load")
	svc, ok := project.Services[name]
	require.True(t, ok, "no compose service %s", name)
	require.NotNil(t, svc.Build)
	require.Equal(t, []string{name}, []string(svc.Command))
	prefix := strings.ToUpper(name)
	require.Equal(t, "postgres://onceflow_"+name+":"+name+"@postgres:5432/onceflow_"+name+"?sslmode=disable", *svc.Environment["DATABASE_URL"])
	require.Equal(t, name, *project.Services["postgres"].Environment[prefix+"_DB_PASSWORD"])
	require.Len(t, svc.Ports, 1)
	require.Equal(t, fmt.Sprint(port), svc.Ports[0].Published)
	require.Equal(t, uint32(8080), svc.Ports[0].Target)
}

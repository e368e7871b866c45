package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A broken handler (or set-based handler: the other one is then the
// correct one), the property of the kit it breaks, and words of the
// failure's advice on what to fix.
type breakage struct {
	name     string
	handler  func(s *testService) conformance.Handler
	property string
	advice   string
	batch    func(s *testService) conformance.BatchHandler
}

// all is every broken handler: the ones the kit always caught and the
// ones it let pass (blindSpots).
func all() []breakage { return slices.Concat(breakages, blindSpots) }

// service is the test service with b's handlers.
func (b breakage) service(t *testing.T) conformance.Service {
	handler := b.handler
	if handler == nil {
		handler = func(s *testService) conformance.Handler { return s.handle }
	}
	return service(t, handler, b.batch)
}

var breakages = []breakage{
	{"own-connection", func(s *testService) conformance.Handler {
		// Its effect through the service's pool, not the inbox's tx.
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			var p event.OrderPlacedV1
			if err := ev.Decode(&p); err != nil {
				return err
			}
			_, err := s.pool.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID)
			return err
		}
	}, "writes-only-on-its-transaction", "through the tx it is given", nil},
	{"direct-publish", func(s *testService) conformance.Handler {
		// Its event published to JetStream at once, not written to the outbox.
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			var p event.OrderPlacedV1
			if err := ev.Decode(&p); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID); err != nil {
				return err
			}
			next, err := s.rejection(ev, p)
			if err != nil {
				return err
			}
			msg, err := next.Msg()
			if err != nil {
				return err
			}
			_, err = s.js.PublishMsg(ctx, msg)
			return err
		}
	}, "emits-through-the-outbox", "outbox.Enqueue", nil},
	{"commits-itself", func(s *testService) conformance.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if err := s.handle(ctx, tx, ev); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
	}, "writes-only-on-its-transaction", "never commit or roll back tx", nil},
	{"in-memory-state", func(s *testService) conformance.Handler {
		// Deduplicates by itself, in memory: a rolled-back run is
		// remembered as done.
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if _, seen := s.seen.LoadOrStore(ev.ID, true); seen {
				return nil
			}
			return s.handle(ctx, tx, ev)
		}
	}, "error-retried-with-backoff", "no state outside the tx it is given", nil},
	{"swallows-decode-error", func(s *testService) conformance.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			var p event.OrderPlacedV1
			if err := ev.Decode(&p); err != nil {
				return nil // "nothing to do with it"
			}
			return s.handle(ctx, tx, ev)
		}
	}, "permanent-error-to-dlq", "swallowed the decode error", nil},
	{"second-pool", func(s *testService) conformance.Handler {
		// Its effect through a connection of its own, as a second pool's.
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
			_, err = conn.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID)
			return err
		})
	}, "writes-only-on-its-transaction", "through the tx it is given", nil},
	{"skips-processed-events", func(s *testService) conformance.Handler {
		// Deduplicates by itself, on the inbox's table: the inbox claimed
		// the event before the handler runs, so it skips every event.
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			var seen bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM processed_events WHERE event_id = $1)`, ev.ID).Scan(&seen); err != nil || seen {
				return err
			}
			return s.handle(ctx, tx, ev)
		}
	}, "reference/duplicate-in-sequence", "not 1", nil},
	{"raw-commit", func(s *testService) conformance.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if err := s.handle(ctx, tx, ev); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		}
	}, "writes-only-on-its-transaction", "the tx it is given", nil},
	{"set-based-skips-poison", nil, "set-based/permanent-error-to-dlq", "swallowed the decode error", func(s *testService) conformance.BatchHandler {
		// Leaves out the events it cannot decode: they are acked, never
		// dead-lettered.
		correct := s.setBased(batchForm{})
		return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *conformance.Pipeline) error {
			return correct(ctx, tx, slices.DeleteFunc(slices.Clone(evs), func(ev event.Envelope) bool {
				return ev.Decode(&event.OrderPlacedV1{}) != nil
			}), writes)
		}
	}},
}

// brokenEnv, set in TestBrokenHandlersFailTheKit's child process, makes
// TestBrokenHandlerProcess run the kit against every broken handler.
const brokenEnv = "CONFORMANCE_BROKEN_HANDLERS"

// TestBrokenHandlerProcess is the child process of
// TestBrokenHandlersFailTheKit, which expects it to fail; run on its own,
// without brokenEnv, it has nothing to do.
func TestBrokenHandlerProcess(t *testing.T) {
	if os.Getenv(brokenEnv) != "1" {
		return
	}
	for _, b := range all() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			conformance.Run(t, b.service(t))
		})
	}
}

// TestBrokenHandlersFailTheKit runs the kit against handlers broken in the
// ways a copier breaks them, each in a child process (the kit fails the
// tests it runs in) that runs only the property it breaks: each fails that
// property, by name, with a message that says what to fix.
func TestBrokenHandlersFailTheKit(t *testing.T) {
	t.Parallel()
	for _, b := range all() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			failed, output := runChild(t, b.pattern())
			var names []string
			for name := range failed {
				if rest, ok := strings.CutPrefix(name, "TestBrokenHandlerProcess/"+b.name+"/"); ok {
					names = append(names, rest)
				}
			}
			slices.Sort(names)
			t.Logf("fails %s", strings.Join(names, ", "))
			want := regexp.MustCompile(`^[^/]+/(([a-z-]+)/)?` + regexp.QuoteMeta(b.property) + `$`)
			i := slices.IndexFunc(names, want.MatchString)
			if i < 0 {
				t.Fatalf("the kit did not fail %s on a handler broken by %s", b.property, b.name)
			}
			out := output["TestBrokenHandlerProcess/"+b.name+"/"+names[i]]
			if !strings.Contains(out, b.advice) {
				t.Errorf("the failure of %s does not say %q:\n%s", b.property, b.advice, out)
			}
		})
	}
}

// pattern is the -test.run pattern of b's child process: b's property
// (mode/property, or property in any mode), on every subscription.
func (b breakage) pattern() string {
	mode, property, ok := strings.Cut(b.property, "/")
	if !ok {
		// A handler property is a subtest of the subscription; a mode
		// property is one of each mode's.
		mode, property = b.property+"|reference|batched|set-based", b.property
	}
	return fmt.Sprintf("^TestBrokenHandlerProcess$/^%s$/./^(%s)$/^%s$", regexp.QuoteMeta(b.name), mode, property)
}

// runChild runs the tests of TestBrokenHandlerProcess that pattern names
// in a child process and returns the tests that failed and each test's
// output.
func runChild(t *testing.T, pattern string) (failed map[string]bool, output map[string]string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "test2json", os.Args[0],
		"-test.v=test2json", "-test.run="+pattern, "-test.parallel=4", "-test.count=1", "-test.timeout=5m")
	// The child's databases on this binary's server: a cluster of its own
	// would cost each child an initdb.
	cmd.Env = append(os.Environ(), brokenEnv+"=1", "TEST_DATABASE_URL="+serverURL(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		t.Fatalf("the kit passed the broken handler (%s):\n%s", pattern, out)
	}
	failed, output = map[string]bool{}, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("test2json: %v: %s", err, sc.Bytes())
		}
		switch ev.Action {
		case "fail":
			failed[ev.Test] = true
		case "output":
			output[ev.Test] += ev.Output
		}
	}
	if len(failed) == 0 {
		t.Fatalf("the child process failed without a failed test (%v):\n%s", err, stderr.String())
	}
	return failed, output
}

// serverURL is the URL of the PostgreSQL server this binary's databases
// are on.
func serverURL(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testenv.NewDatabase(t, postgres.Schema{}).URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawPath = "/postgres", ""
	return u.String()
}

// TestUntestedSubscriptionProcess is the child process of
// TestUntestedSubscriptionsFailTheKit: services that leave a durable of
// theirs, or an event type a durable consumes, without a Subscription.
func TestUntestedSubscriptionProcess(t *testing.T) {
	if os.Getenv(brokenEnv) != "1" {
		return
	}
	correct := func(s *testService) conformance.Handler { return s.handle }
	t.Run("missing-durable", func(t *testing.T) {
		svc := service(t, correct, nil)
		svc.Name = "payment" // whose durables are payment-orders, payment-inventory and payment-expiries
		conformance.Run(t, svc)
	})
	t.Run("missing-type", func(t *testing.T) {
		svc := service(t, correct, nil)
		newSubs := svc.New
		svc.New = func(env conformance.Env) []conformance.Subscription {
			subs := newSubs(env)
			subs[0].Stream, subs[0].Durable = streams.Orders, streams.NotifyOrders // which consumes five types
			return subs
		}
		conformance.Run(t, svc)
	})
	// Wired: the service's wiring and its tests, by durable.
	wired := func(t *testing.T, durables []string, tested ...string) conformance.Service {
		svc := service(t, correct, nil)
		newSubs := svc.New
		svc.New = func(env conformance.Env) []conformance.Subscription {
			sub := newSubs(env)[0]
			var wiring []app.Subscription
			for _, d := range durables {
				wiring = append(wiring, app.Subscription{Durable: d, Handler: sub.Handler})
			}
			tests := map[string][]conformance.Test{}
			for _, d := range tested {
				tests[d] = []conformance.Test{{NewEvent: sub.NewEvent, Effect: sub.Effect}}
			}
			return conformance.Wired(wiring, tests)
		}
		return svc
	}
	t.Run("wired-untested", func(t *testing.T) {
		conformance.Run(t, wired(t, []string{streams.PaymentOrders, streams.PaymentExpiries}, streams.PaymentOrders))
	})
	t.Run("tested-unwired", func(t *testing.T) {
		conformance.Run(t, wired(t, []string{streams.PaymentOrders}, streams.PaymentOrders, streams.PaymentInventory))
	})
}

// TestUntestedSubscriptionsFailTheKit checks that the kit fails a service
// whose test leaves out a durable of the service's (as its wiring runs
// them), or an event type a durable consumes, or whose wiring and tests
// (Wired) name different durables, before any property runs.
func TestUntestedSubscriptionsFailTheKit(t *testing.T) {
	t.Parallel()
	// No property runs: the check comes first.
	failed, output := runChild(t, "^TestUntestedSubscriptionProcess$/./^none$")
	for name, want := range map[string]string{
		"missing-durable": "the service's durable payment-inventory (internal/streams) has no Subscription",
		"missing-type":    "durable notify-orders consumes orders.confirmed.v1, but no Subscription of it makes such an event",
		"wired-untested":  "durable payment-expiries is wired, and Wired has no test of it",
		"tested-unwired":  "Wired has a test of durable payment-inventory, which is not wired",
	} {
		test := "TestUntestedSubscriptionProcess/" + name
		if !failed[test] {
			t.Errorf("the kit passed a service whose test has a %s", name)
		}
		if !strings.Contains(output[test], want) {
			t.Errorf("the failure of a %s does not say %q:\n%s", name, want, output[test])
		}
	}
}

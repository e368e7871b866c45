package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// Event is an onceflow event, the CloudEvents envelope every handler
// receives. It is an alias, so that a service in another module can name
// it, build it and read its fields; its Type is one of the saga's event
// types, whose payloads are JSON in Data.
type Event = event.Envelope

// Handler is the inbox's handler: it applies one event's effect, writing
// through tx only, and returns an error to have it retried (or a Permanent
// one to have it dead-lettered). A service's inbox.Handler is one.
type Handler = func(ctx context.Context, tx pgx.Tx, ev Event) error

// BatchHandler is the inbox's set-based handler (inbox.BatchHandler): it
// applies the effects of a batch's new events at once, and queues its
// writes on writes.
type BatchHandler = func(ctx context.Context, tx pgx.Tx, evs []Event, writes *Pipeline) error

// Pipeline is the explicit write pipeline a BatchHandler queues its writes
// on (a sqlc DBTX whose :exec statements run with the COMMIT). It is an
// alias, so that a service in another module can write a BatchHandler.
type Pipeline = postgres.Pipeline

// ErrInvalid is wrapped by the error of Event.Decode: an event whose
// payload is malformed. A handler that returns it (or wraps it) has the
// event dead-lettered at once.
var ErrInvalid = event.ErrInvalid

// ErrPermanent is wrapped by Permanent's errors.
var ErrPermanent = inbox.ErrPermanent

// Permanent marks err as one no retry can fix: the event is dead-lettered
// at once, with err as its reason. It is inbox.Permanent.
func Permanent(err error) error { return inbox.Permanent(err) }

// Service is what the kit runs: a service's database schema and its
// subscriptions.
type Service struct {
	// Name is the service's name, the ce-source of the events it emits.
	Name string
	// Migrations is the service's own migration set (goose SQL files, as
	// in db/migrations/NAME), applied after the platform's (the inbox, the
	// outbox and the idempotency keys).
	Migrations fs.FS
	// New builds the service on a property's database and NATS server and
	// returns its subscriptions. It is called once per property run, each
	// on a database and a server of its own.
	New func(env Env) []Subscription
}

// Env is the world of one property run: the service's database, migrated,
// and a NATS server whose streams are the saga's. A service's constructor
// takes what it needs of it.
type Env struct {
	// Pool is open on the service's database.
	Pool *pgxpool.Pool
	// JS is a JetStream client of the NATS server, with every right. A
	// handler must not publish with it: what it emits goes through the
	// outbox.
	JS jetstream.JetStream
}

// Subscription is one durable consumer of the service and what the kit
// needs to test its handler.
type Subscription struct {
	// Durable names the durable consumer. A durable of the saga's
	// topology (internal/streams) has its stream and filter subjects from
	// there; another one needs Stream and Subjects.
	Durable string
	// Stream and Subjects are the stream and subjects of a durable that is
	// not in the saga's topology.
	Stream   string
	Subjects []string
	// Handler is the subscription's handler, run as the inbox runs it.
	Handler Handler
	// BatchHandler, when the service runs the subscription set-based, is
	// its set-based handler; the set-based mode is then tested too.
	BatchHandler BatchHandler
	// NewEvent returns a new event (a fresh id) that the handler applies
	// with an effect Effect can see. It may prepare the database for it
	// (e.g. credit the wallet an order will debit), through env.Pool.
	// Every event type the durable consumes must be made: by a
	// Subscription of its own (notify's test), or by a NewEvent that makes
	// the durable's types in turn, one per call (order's test); the kit
	// fails a durable of the service that has no Subscription, and a type
	// no NewEvent makes.
	NewEvent func(t testing.TB, env Env) Event
	// NewEvents, when set, returns n new events that share the entities
	// they touch (one customer's wallet, one SKU), the database prepared
	// for all of them: the kit batches them and runs them concurrently,
	// where a set-based handler that keeps one change per entity, or a
	// read that does not lock what it updates, loses one. Without it the
	// kit makes those events with NewEvent, and they share nothing.
	NewEvents func(t testing.TB, env Env, n int) []Event
	// Effect counts how many times ev's effect is in the database: 0
	// before it was processed, 1 after. Count builds one from a query.
	Effect func(ctx context.Context, db *pgxpool.Pool, ev Event) (int, error)

	// wiring is why Wired could not match this subscription with a test.
	wiring error
}

// Test is what the kit needs of a subscription besides its wiring: the
// fields of Subscription of the same names.
type Test struct {
	NewEvent  func(t testing.TB, env Env) Event
	NewEvents func(t testing.TB, env Env, n int) []Event
	Effect    func(ctx context.Context, db *pgxpool.Pool, ev Event) (int, error)
}

// Wired returns the subscriptions of a service as its Run wires them (the
// list it gives app.Spec), each with its tests, tests[durable]: one
// Subscription per test, its handler the wired one and, for a Batched
// subscription with a BatchHandler, its set-based form too. So the kit
// tests the wiring the service runs, declared once. A wired durable with no
// test, or a test of a durable that is not wired, fails the kit.
func Wired(wired []app.Subscription, tests map[string][]Test) []Subscription {
	var subs []Subscription
	for _, w := range wired {
		if len(tests[w.Durable]) == 0 {
			subs = append(subs, Subscription{Durable: w.Durable,
				wiring: fmt.Errorf("durable %s is wired, and Wired has no test of it", w.Durable)})
		}
		for _, tc := range tests[w.Durable] {
			sub := Subscription{Durable: w.Durable, Handler: w.Handler,
				NewEvent: tc.NewEvent, NewEvents: tc.NewEvents, Effect: tc.Effect}
			if w.Batched {
				sub.BatchHandler = w.BatchHandler
			}
			subs = append(subs, sub)
		}
	}
	for _, durable := range slices.Sorted(maps.Keys(tests)) { // the same order at every call of New
		if !slices.ContainsFunc(wired, func(w app.Subscription) bool { return w.Durable == durable }) {
			subs = append(subs, Subscription{Durable: durable,
				wiring: fmt.Errorf("Wired has a test of durable %s, which is not wired", durable)})
		}
	}
	return subs
}

// Count is an Effect that runs query with one argument, arg(ev), and
// scans the count it returns, e.g.
//
//	conformance.Count(`SELECT count(*) FROM point_awards WHERE order_id = $1`,
//		func(ev conformance.Event) any { return ev.Subject })
func Count(query string, arg func(ev Event) any) func(context.Context, *pgxpool.Pool, Event) (int, error) {
	return func(ctx context.Context, db *pgxpool.Pool, ev Event) (int, error) {
		var n int
		if err := db.QueryRow(ctx, query, arg(ev)).Scan(&n); err != nil {
			return 0, fmt.Errorf("count the effect of %s: %w", ev.ID, err)
		}
		return n, nil
	}
}

// Main runs a test binary's tests on the kit's servers and stops them
// afterwards; call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(conformance.Main(m)) }
//
// It starts a throwaway PostgreSQL cluster from the local installation
// (or uses TEST_DATABASE_URL, or containers where an engine runs) and
// embeds nats-server (or uses TEST_NATS_URL); see internal/testenv.
func Main(m *testing.M) int { return testenv.Run(m) }

// Run runs every property against each of svc's subscriptions, each as a
// parallel subtest named subscription/property, or
// subscription/mode/property for the properties the inbox's mode can
// change. Each property runs on a database and a NATS server of its own.
func Run(t *testing.T, svc Service) {
	t.Helper()
	if err := svc.validate(); err != nil {
		t.Fatalf("conformance: %v", err)
	}
	// The subscriptions' names and modes, from a service built once on a
	// database of its own.
	probe := newWorld(t, svc)
	probe.requireEverySubscription(t, svc.Name)
	for i, sub := range probe.subs {
		t.Run(sub.Durable, func(t *testing.T) {
			t.Parallel()
			for _, p := range properties {
				t.Run(p.name, func(t *testing.T) {
					t.Parallel()
					p.check(t, newWorld(t, svc).subject(t, i))
				})
			}
			for _, m := range modesOf(sub) {
				t.Run(m.name, func(t *testing.T) {
					t.Parallel()
					for _, p := range modeProperties {
						t.Run(p.name, func(t *testing.T) {
							t.Parallel()
							s := newWorld(t, svc).subject(t, i)
							s.mode = m
							p.check(t, s)
						})
					}
				})
			}
		})
	}
}

func (svc Service) validate() error {
	switch {
	case svc.Name == "":
		return fmt.Errorf("Service.Name is required")
	case svc.New == nil:
		return fmt.Errorf("Service.New is required")
	}
	return nil
}

// mode is a way the inbox runs a subscription.
type mode struct {
	name     string
	batched  bool
	setBased bool
}

var (
	reference = mode{name: "reference"}
	batched   = mode{name: "batched", batched: true}
	setBased  = mode{name: "set-based", batched: true, setBased: true}
)

// modesOf is every mode sub can run in: the reference path, batched, and
// set-based where it has a set-based handler.
func modesOf(sub Subscription) []mode {
	ms := []mode{reference, batched}
	if sub.BatchHandler != nil {
		ms = append(ms, setBased)
	}
	return ms
}

// property is one named guarantee and its check.
type property struct {
	name  string
	check func(t *testing.T, s *subject)
}

// waitFor bounds every awaited condition.
const waitFor = 30 * time.Second

// await polls cond until it holds, and fails the test with what's message
// if it does not within waitFor.
func await(t *testing.T, cond func() (bool, error), what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("conformance: %s: %v", fmt.Sprintf(what, args...), err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s (waited %s)", fmt.Sprintf(what, args...), waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

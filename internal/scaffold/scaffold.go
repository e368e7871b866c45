package scaffold

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"go/token"
	"go/types"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Module is the module path of the repository the generator writes into.
const Module = "github.com/onceflow/onceflow"

// maxNameLength keeps the service's database, role and durable names short.
const maxNameLength = 30

// Config says what to generate.
type Config struct {
	// Root is the repository's root directory, where go.mod is.
	Root string
	// Name is the new service's name: a lowercase Go identifier, which
	// becomes its package, command, database, migration set and event
	// source.
	Name string
	// Consumes are the events the service consumes, each by its constant in
	// package event (OrderConfirmed) or its CloudEvents type.
	Consumes []string
	// Emits, when set, is the event the service emits for each event it
	// consumes: a new type, by the name of its constant in package event
	// (PointsAwarded), added to internal/event on a stream of the service's
	// own.
	Emits string
	// Reserved are names the service may not take besides those the
	// repository uses, such as the command line's commands.
	Reserved []string
	// Go is the go command that runs `go tool sqlc generate`; default "go".
	Go string

	failAfter int // see staging.failAfter
}

// Result is what Generate did.
type Result struct {
	// Created are the files written, relative to the root, sorted.
	Created []string
	// Changed are the existing files changed, relative to the root.
	Changed []string
	// HostPort is the port the compose service publishes on 127.0.0.1.
	HostPort int
	// Subscriptions are the durable consumers of the service.
	Subscriptions []Subscription
	// Emits is the event type the service emits, nil for none.
	Emits *Emitted
}

// Subscription is one durable consumer of a generated service: one per
// stream it reads, with a handler per event type.
type Subscription struct {
	Stream Stream
	// Durable is the consumer's name, e.g. loyalty-orders.
	Durable string
	// DurableConst is its constant in package streams, e.g. LoyaltyOrders:
	// a generated service's durables are declared with the saga's, in
	// streams.Saga.
	DurableConst string
	// Subjects filter the stream to the consumed events.
	Subjects []string
	Events   []Event
	// Handler is the method of the subscription: the event's handler, or a
	// dispatcher to the handlers when several events share the stream.
	Handler  string
	Dispatch bool
}

// data is what the templates are rendered with.
type data struct {
	Name          string
	EnvPrefix     string // LOYALTY, for LOYALTY_DB_PASSWORD
	HostPort      int
	Events        []Event
	Subscriptions []Subscription
	Emits         *Emitted // nil: the service emits nothing
	Services      []string // the registry's, with Name last
}

var validName = regexp.MustCompile(`^[a-z][a-z0-9]*$`)

// fixedReserved are names that would collide with the repository's own
// directories or the compose file's infrastructure.
var fixedReserved = []string{"platform", "internal", "registry", "postgres", "nats", "mailpit", "dbsqlc"}

// Generate generates the service cfg describes into the repository at
// cfg.Root. On error it has changed nothing.
func Generate(ctx context.Context, cfg Config) (Result, error) {
	root, err := filepath.Abs(cmp.Or(cfg.Root, "."))
	if err != nil {
		return Result{}, err
	}
	d, edits, err := plan(root, cfg)
	if err != nil {
		return Result{}, err
	}
	files, err := renderService(d)
	if err != nil {
		return Result{}, err
	}
	if err := checkImports(d.Name, files, edits.changed[registryFile]); err != nil {
		return Result{}, err
	}

	st, err := newStaging(root)
	if err != nil {
		return Result{}, err
	}
	defer st.remove()
	st.failAfter = cfg.failAfter
	if err := st.write(files); err != nil {
		return Result{}, err
	}
	generated, err := st.sqlc(ctx, cmp.Or(cfg.Go, "go"), d.Name, edits.changed[sqlcFile])
	if err != nil {
		return Result{}, err
	}
	for _, f := range generated {
		files[f] = nil // written by sqlc, already in staging
	}
	if err := st.commit(serviceDirs(d.Name), edits.changed); err != nil {
		return Result{}, err
	}

	res := Result{HostPort: d.HostPort, Subscriptions: d.Subscriptions, Emits: d.Emits}
	res.Created = slices.Sorted(maps.Keys(files))
	res.Changed = slices.Sorted(maps.Keys(edits.changed))
	return res, nil
}

// plan checks cfg against the repository at root and returns what to
// render the service with and the existing files' new contents, computed in
// memory: anything they refuse is refused before a file is written.
func plan(root string, cfg Config) (data, *editor, error) {
	if err := checkModule(root); err != nil {
		return data{}, nil, err
	}
	name := cfg.Name
	if err := checkName(name); err != nil {
		return data{}, nil, err
	}
	for _, dir := range serviceDirs(name) {
		if _, err := os.Lstat(filepath.Join(root, dir)); err == nil {
			return data{}, nil, fmt.Errorf("service %q exists: %s is there", name, dir)
		} else if !errors.Is(err, os.ErrNotExist) {
			return data{}, nil, err
		}
	}
	if slices.Contains(fixedReserved, name) || slices.Contains(cfg.Reserved, name) {
		return data{}, nil, fmt.Errorf("service name %q: taken by a command or by the repository", name)
	}

	cat, err := loadCatalog(root)
	if err != nil {
		return data{}, nil, err
	}
	events, err := resolveEvents(cat, cfg.Consumes)
	if err != nil {
		return data{}, nil, err
	}
	emits, err := resolveEmitted(cat, name, cfg.Emits, events)
	if err != nil {
		return data{}, nil, err
	}
	edits := &editor{root: root}
	services, err := edits.registryNames()
	if err != nil {
		return data{}, nil, err
	}
	if slices.Contains(services, name) {
		return data{}, nil, fmt.Errorf("service %q exists: internal/registry lists it", name)
	}
	d := data{
		Name:          name,
		EnvPrefix:     strings.ToUpper(name),
		Events:        events,
		Subscriptions: subscriptions(name, events),
		Emits:         emits,
		Services:      append(slices.Clone(services), name),
	}
	if d.HostPort, err = edits.compose(&d, len(services)); err != nil {
		return data{}, nil, err
	}
	for _, edit := range []func(data) error{edits.sqlc, edits.registry, edits.prometheus, edits.streams, edits.event} {
		if err := edit(d); err != nil {
			return data{}, nil, err
		}
	}
	return d, edits, nil
}

// serviceDirs are the directories a service owns, relative to the root.
func serviceDirs(name string) []string {
	return []string{
		filepath.Join("services", name),
		filepath.Join("db", "migrations", name),
		filepath.Join("db", "queries", name),
	}
}

// checkModule checks that root is the onceflow repository.
func checkModule(root string) error {
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return fmt.Errorf("%s is not the root of the onceflow repository: %w", root, err)
	}
	for line := range bytes.Lines(mod) {
		if f := strings.Fields(string(line)); len(f) == 2 && f[0] == "module" {
			if f[1] != Module {
				return fmt.Errorf("%s is module %s, not %s", root, f[1], Module)
			}
			return nil
		}
	}
	return fmt.Errorf("%s/go.mod declares no module", root)
}

// checkName refuses a name that is not a lowercase Go identifier usable as
// a package, command, database and durable name.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("a service name is required")
	case !validName.MatchString(name):
		return fmt.Errorf("service name %q: want a lowercase Go identifier of letters and digits, starting with a letter (e.g. loyalty)", name)
	case len(name) > maxNameLength:
		return fmt.Errorf("service name %q: longer than %d characters", name, maxNameLength)
	case token.IsKeyword(name):
		return fmt.Errorf("service name %q: a Go keyword", name)
	case types.Universe.Lookup(name) != nil:
		return fmt.Errorf("service name %q: a predeclared Go identifier", name)
	}
	return nil
}

// resolveEvents looks up the consumed events, in the order given.
func resolveEvents(cat catalog, names []string) ([]Event, error) {
	var events []Event
	for _, n := range names {
		e, err := cat.lookup(n)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(events, func(x Event) bool { return x.Name == e.Name }) {
			return nil, fmt.Errorf("event %s named twice", e.Name)
		}
		// The starter handler keys its tally by customer; every saga
		// payload embeds event.Order.
		if !slices.Contains(e.Fields, "Order") {
			return nil, fmt.Errorf("event %s: its payload %s does not embed event.Order, which the generated handler needs", e.Name, e.Payload)
		}
		events = append(events, e)
	}
	return events, nil
}

// expiryEvent is the event that ends an order at its deadline: a
// participant compensates what it did for the order (docs/saga.md).
const expiryEvent = "OrderExpired"

// subscriptions groups events by stream: one durable per stream, in the
// order the events were given, except OrderExpired, which gets a durable
// of its own (NAME-expiries), as payment's and inventory's: a compensation
// is not held up behind the forward events of a stalled durable, and may
// overtake them (docs/saga.md, "A new participant").
func subscriptions(name string, events []Event) []Subscription {
	var subs []Subscription
	for _, e := range events {
		durable := durableOf(name, e)
		i := slices.IndexFunc(subs, func(s Subscription) bool { return s.Durable == durable })
		if i < 0 {
			title := strings.TrimPrefix(durableConst(name, e), titleCase(name))
			subs = append(subs, Subscription{
				Stream:       e.Stream,
				Durable:      durable,
				DurableConst: durableConst(name, e),
				Handler:      "handle" + title + "Event",
			})
			i = len(subs) - 1
		}
		subs[i].Events = append(subs[i].Events, e)
		subs[i].Subjects = append(subs[i].Subjects, e.Subject)
	}
	for i := range subs {
		if len(subs[i].Events) == 1 {
			subs[i].Handler = "Handle" + subs[i].Events[0].Name
		} else {
			subs[i].Dispatch = true
		}
	}
	return subs
}

// durableOf is the durable of the service name that e is delivered on.
func durableOf(name string, e Event) string {
	if e.Name == expiryEvent {
		return name + "-expiries"
	}
	return name + "-" + strings.ToLower(e.Stream.Name)
}

// durableConst is the constant of durableOf in package streams, e.g.
// LoyaltyOrders.
func durableConst(name string, e Event) string {
	if e.Name == expiryEvent {
		return titleCase(name) + "Expiries"
	}
	return titleCase(name) + titleCase(e.Stream.Name)
}

// titleCase turns ORDERS into Orders.
func titleCase(s string) string {
	s = strings.ToLower(s)
	return strings.ToUpper(s[:1]) + s[1:]
}

package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/onceflow/onceflow/internal/scaffold"
)

// newCommand is `onceflow new service`.
func newCommand() command {
	return command{
		name:    "new",
		usage:   "service NAME [--consumes EVENT...] [--emits EVENT] [--dir DIR]",
		summary: "scaffold a new service as docs/new-service.md describes it",
		run:     runNew,
	}
}

func runNew(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("new", commandUsage("new"), `
Scaffolds the service NAME in the repository: its package in services/NAME
(doc.go, config.go, run.go, NAME.go with a handler per consumed event wired
through the inbox, http.go and openapi.yaml, tests on the real servers), its
migrations and queries in db/, its sqlc.yaml entry and generated code (it
runs 'go tool sqlc generate' for the new entry), its compose service, and
its entry in internal/registry, which gives it its command and its place in
'onceflow dev'. Then it prints what to edit next.

NAME is a lowercase Go identifier that nothing in the repository uses yet.
Each EVENT consumed is a constant of internal/event (OrderConfirmed,
StockRejected, …); the service gets one durable consumer per stream, named
NAME-<stream>, declared in internal/streams beside the saga's. The EVENT
emitted is a new type (PointsAwarded): its constant, payload and contract
test are added to internal/event, its stream NAME.> to internal/streams,
and each handler writes one to the outbox on its transaction.
Nothing is changed unless everything succeeds.`)
	dir := fs.String("dir", ".", "the repository's root `DIR`")
	emits := fs.String("emits", "", "a new `EVENT` type the service emits for each event it consumes, e.g. PointsAwarded")
	var consumes []string
	fs.Func("consumes", "an `EVENT` the service consumes; several may follow one --consumes, or be comma-separated", func(v string) error {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				consumes = append(consumes, e)
			}
		}
		return nil
	})
	flags, positional := splitNewArgs(fs, args)
	if err := parse(fs, flags, inv.stdout); err != nil {
		return helped(err)
	}
	if len(positional) != 2 || positional[0] != "service" {
		return usageError(fs, "want 'onceflow new service NAME [--consumes EVENT...] [--emits EVENT]'")
	}
	var reserved []string
	for _, c := range commands() {
		reserved = append(reserved, c.name)
	}
	name := positional[1]
	res, err := scaffold.Generate(ctx, scaffold.Config{Root: *dir, Name: name, Consumes: consumes, Emits: *emits, Reserved: reserved})
	if err != nil {
		return fmt.Errorf("new service: %w", err)
	}
	printScaffolded(inv.stdout, name, res)
	return nil
}

// splitNewArgs separates flags from positional arguments wherever they
// are, and turns the events listed after --consumes into one --consumes
// each.
func splitNewArgs(fs *flag.FlagSet, args []string) (flags, positional []string) {
	consuming := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(positional, args[i+1:]...)
		case strings.HasPrefix(a, "-"):
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			consuming = name == "consumes" && !hasValue
			flags = append(flags, a)
			f := fs.Lookup(name)
			if f == nil || hasValue || i+1 >= len(args) {
				continue
			}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				continue
			}
			flags = append(flags, args[i+1])
			i++
		case consuming:
			flags = append(flags, "--consumes", a)
		default:
			positional = append(positional, a)
		}
	}
	return flags, positional
}

// printScaffolded says what was written and what to edit next.
func printScaffolded(w io.Writer, name string, res scaffold.Result) {
	fmt.Fprintf(w, "Scaffolded the %s service.\n\nCreated:\n", name)
	for _, f := range res.Created {
		fmt.Fprintf(w, "  %s\n", f)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nChanged:")
	why := map[string]string{
		"sqlc.yaml":                        "its entry, generated with 'go tool sqlc generate'",
		"docker-compose.yml":               fmt.Sprintf("its service (on 127.0.0.1:%d), and %s_DB_PASSWORD for postgres", res.HostPort, strings.ToUpper(name)),
		"internal/registry/registry.go":    fmt.Sprintf("its command ('onceflow %s') and its place in 'onceflow dev' and 'onceflow migrate'", name),
		"deploy/prometheus/prometheus.yml": "its /metrics, scraped in the compose observability profile",
		"internal/streams/streams.go":      "its durables (and the stream of what it emits) in streams.Saga",
		"internal/event/types.go":          "the type it emits, in Types and NATSSubject",
		"internal/event/payloads.go":       "the payload of the type it emits",
		"internal/event/event_test.go":     "the contract test of the type it emits",
	}
	for _, f := range res.Changed {
		fmt.Fprintf(tw, "  %s\t%s\n", f, why[f])
	}
	if len(res.Subscriptions) > 0 {
		fmt.Fprintln(tw, "\nConsumes (durable on stream: events → handler):")
		for _, s := range res.Subscriptions {
			var events []string
			for _, e := range s.Events {
				events = append(events, e.Name)
			}
			fmt.Fprintf(tw, "  %s on %s:\t%s → %s\n", s.Durable, s.Stream.Name, strings.Join(events, ", "), s.Handler)
		}
	}
	if e := res.Emits; e != nil {
		per := "one per event consumed"
		if slices.ContainsFunc(res.Subscriptions, func(s scaffold.Subscription) bool { return s.Durable == name+"-expiries" }) {
			per += " but OrderExpired (compensated, not carried forward)"
		}
		fmt.Fprintf(tw, "\nEmits:\n  %s on %s (stream %s), %s\n", e.Name, e.Subject, e.Stream.Name, per)
	}
	_ = tw.Flush()

	pkg := path.Join("services", name)
	fmt.Fprintf(w, `
Next:
  1. go test ./%[1]s/
     The generated tests pass as they are, on real PostgreSQL and NATS.
  2. %[1]s/doc.go: say what the service owns and guarantees.
  3. db/migrations/%[2]s/00002_<what>.sql and db/queries/%[2]s/<what>.sql:
     the service's own tables and queries, replacing the starter
     customer_events table; then 'go tool sqlc generate'.
  4. %[1]s/%[2]s.go: each handler's effect, written on its tx only (the
     inbox commits it with the event's claim); events to emit go to the
     outbox on the same tx.
  5. %[1]s/http.go and openapi.yaml: its routes (a test keeps the two in step).
  6. go run ./cmd/onceflow dev --seed
     runs it beside the other services; docker compose up --build too.
docs/new-service.md says why each file is shaped the way it is.
`, pkg, name)
}

package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// dlqEnv is what `onceflow dlq` reads from the environment.
type dlqEnv struct {
	// NATS is reached with the operator's credentials.
	NATS natsauth.Client
	// Operator names who replays and discards, unless --by does.
	Operator string `env:"ONCEFLOW_OPERATOR"`
	User     string `env:"USER"`
}

const dlqUsage = "list|show|replay|discard …"

func runDLQ(ctx context.Context, inv invocation, args []string) error {
	subs := map[string]func(context.Context, invocation, dlqEnv, []string) error{
		"list": dlqList, "show": dlqShow, "replay": dlqReplay, "discard": dlqDiscard,
	}
	if len(args) == 0 || subs[args[0]] == nil {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(inv.stdout, `Usage: onceflow dlq list|show|replay|discard

  list     [--consumer C] [--type T] [--reason TEXT] [--order ID] [--since T] [--until T] [--status S] [--after ID] [--limit N] [--json]
  show     ID [--json]
  replay   ID... | --consumer C --since T   [--past-retention] [--force] [--by WHO]
  discard  ID... --reason TEXT [--by WHO]

Run 'onceflow dlq <subcommand> -h' for its flags.
`)
			return nil
		}
		return fmt.Errorf("dlq: want 'onceflow dlq %s' (see 'onceflow dlq -h')", dlqUsage)
	}
	cfg, err := env.ParseAs[dlqEnv]()
	if err != nil {
		return fmt.Errorf("dlq config: %w", err)
	}
	return helped(subs[args[0]](ctx, inv, cfg, args[1:]))
}

// dlqStore connects to NATS and returns the DLQ store and a close func.
func dlqStore(cfg dlqEnv) (*dlq.Store, func(), error) {
	js, closeNATS, err := operatorJetStream(cfg.NATS, "dlq")
	if err != nil {
		return nil, nil, err
	}
	return dlq.New(js, dlq.Config{Topology: streams.Saga(streams.Config{})}), closeNATS, nil
}

// operatorJetStream connects to NATS with the operator's credentials, as
// the command named cmd, and returns its JetStream and a close func.
func operatorJetStream(client natsauth.Client, cmd string) (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(client.URL, append(client.Options(streams.Operator), nats.Name("onceflow-"+cmd))...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: connect to nats: %w", cmd, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%s: jetstream: %w", cmd, err)
	}
	return js, nc.Close, nil
}

// filterFlags adds the flags of a dlq.Filter to fs; the returned func reads
// them once fs is parsed.
func filterFlags(fs *flag.FlagSet) func() (dlq.Filter, error) {
	consumer := fs.String("consumer", "", "only entries of this durable consumer (e.g. inventory-payments)")
	typ := fs.String("type", "", "only events of this type (e.g. onceflow.payment.debited.v1)")
	reason := fs.String("reason", "", "only entries whose reason contains this text, in any case")
	order := fs.String("order", "", "only events of this order (their ce-subject)")
	since := fs.String("since", "", "only entries dead-lettered since: RFC 3339 or a duration ago (24h)")
	until := fs.String("until", "", "only entries dead-lettered until: RFC 3339 or a duration ago")
	return func() (dlq.Filter, error) {
		f := dlq.Filter{Consumer: *consumer, Type: *typ, Reason: *reason, OrderID: *order}
		var err error
		now := time.Now()
		if *since != "" {
			if f.Since, err = parseSince(*since, now); err != nil {
				return f, err
			}
		}
		if *until != "" {
			if f.Until, err = parseSince(*until, now); err != nil {
				return f, fmt.Errorf("--until: %w", err)
			}
		}
		return f, nil
	}
}

func dlqList(ctx context.Context, inv invocation, cfg dlqEnv, args []string) error {
	fs := flagSet("dlq list", "[flags]", `
Lists the DLQ's entries, oldest first, with the consumer that gave up on
each, its event and its status (open, replayed or discarded). NATS is
NATS_URL.`)
	filter := filterFlags(fs)
	status := fs.String("status", "", "only entries with this status: open, replayed or discarded")
	after := fs.Uint64("after", 0, "only entries with a greater ID (the cursor the previous page printed)")
	limit := fs.Int("limit", 100, "at most this many entries")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args, inv.stdout); err != nil {
		return err
	}
	f, err := filter()
	if err != nil {
		return usageError(fs, err.Error())
	}
	switch s := dlq.Status(*status); {
	case fs.NArg() > 0:
		return usageError(fs, "takes no arguments")
	case s != "" && s != dlq.Open && s != dlq.Replayed && s != dlq.Discarded:
		return usageError(fs, "--status: want open, replayed or discarded")
	case *limit < 1:
		return usageError(fs, "--limit must be positive")
	}
	f.Status, f.After, f.Limit = dlq.Status(*status), *after, *limit
	store, closeNATS, err := dlqStore(cfg)
	if err != nil {
		return err
	}
	defer closeNATS()
	page, err := store.List(ctx, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(inv.stdout, page)
	}
	printEntries(inv.stdout, page.Entries)
	if page.Next != 0 {
		fmt.Fprintf(inv.stdout, "more: --after %d\n", page.Next)
	}
	return nil
}

// printEntries prints entries as a table.
func printEntries(w io.Writer, entries []dlq.Entry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEAD-LETTERED\tCONSUMER\tTYPE\tORDER\tSTATUS\tCHECK\tREASON")
	for _, e := range entries {
		reason := e.Reason
		if len(reason) > 80 {
			reason = reason[:77] + "..."
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.DeadLettered.UTC().Format(time.RFC3339),
			e.Consumer, e.EventType, e.OrderID, e.Status(), checkOf(e), reason)
	}
	_ = tw.Flush()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dlqShow(ctx context.Context, inv invocation, cfg dlqEnv, args []string) error {
	fs := flagSet("dlq show", "ID [--json]", `
Shows one DLQ entry: why it was dead-lettered, by which consumer, after how
many deliveries, where the original is stored, its headers, its payload
and what was done with it.`)
	asJSON := fs.Bool("json", false, "print JSON")
	positional, err := parseMixed(fs, args, inv.stdout)
	if err != nil {
		return err
	}
	ids, err := entryIDs(positional)
	if err != nil || len(ids) != 1 {
		return usageError(fs, "want one entry ID")
	}
	store, closeNATS, err := dlqStore(cfg)
	if err != nil {
		return err
	}
	defer closeNATS()
	e, err := store.Get(ctx, ids[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(inv.stdout, e)
	}
	printEntry(inv.stdout, e)
	return nil
}

// checkOf is what the check of e found, in a word: "verified" (its
// original was re-read), "unverified" (replayed only with --force) or
// "unreplayable" (not verifiable either, and refused even forced).
func checkOf(e dlq.Entry) string {
	switch {
	case e.Unreplayable != "":
		return "unreplayable"
	case e.Unverified != "":
		return "unverified"
	}
	return "verified"
}

// checkDetail says what the check of e found, and why.
func checkDetail(e dlq.Entry) string {
	switch {
	case e.Unreplayable != "":
		return "not verifiable and unreplayable, even with --force: " + e.Unreplayable
	case e.Unverified != "":
		return "not verifiable: " + e.Unverified + " (a replay needs --force and publishes the entry's own copy)"
	}
	return "verified: the original is in the stream, and a replay publishes it"
}

// printEntry prints one entry in full.
func printEntry(w io.Writer, e dlq.Entry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, row := range [][2]string{
		{"entry", strconv.FormatUint(e.ID, 10)},
		{"status", string(e.Status())},
		{"dead-lettered", e.DeadLettered.UTC().Format(time.RFC3339Nano)},
		{"consumer", e.Consumer},
		{"reason", e.Reason},
		{"deliveries", strconv.FormatUint(e.Deliveries, 10)},
		{"original", fmt.Sprintf("%s sequence %d, subject %s", e.Stream, e.StreamSeq, e.Subject)},
		{"check", checkDetail(e)},
		{"event", fmt.Sprintf("%s %s from %s at %s", e.EventType, e.EventID, e.EventSource, e.EventTime.UTC().Format(time.RFC3339Nano))},
		{"order", e.OrderID},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "headers:")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range e.Headers {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(w, "  %s: %s\n", k, strings.Join(e.Headers[k], ", "))
	}
	fmt.Fprintln(w, "payload:")
	var pretty bytes.Buffer
	if json.Indent(&pretty, e.Data, "  ", "  ") == nil {
		fmt.Fprintf(w, "  %s\n", pretty.String())
	} else {
		fmt.Fprintf(w, "  %q\n", e.Data)
	}
	for _, a := range e.Actions {
		fmt.Fprintf(w, "%s by %s at %s", a.Kind, a.By, a.At.UTC().Format(time.RFC3339))
		if a.Reason != "" {
			fmt.Fprintf(w, ": %s", a.Reason)
		}
		if a.ReplaySeq != 0 {
			fmt.Fprintf(w, " (on %s, sequence %d)", a.ReplaySubject, a.ReplaySeq)
		}
		if a.Unverified {
			fmt.Fprint(w, ", forced: the entry's own copy")
		}
		fmt.Fprintln(w)
	}
}

// parseMixed parses args into fs with flags before, between and after the
// positional arguments, which it returns.
func parseMixed(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var positional []string
	for {
		if err := parse(fs, args, stdout); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// entryIDs reads DLQ entry IDs.
func entryIDs(args []string) ([]uint64, error) {
	ids := make([]uint64, len(args))
	for i, a := range args {
		id, err := strconv.ParseUint(a, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("entry ID %q: want a positive number", a)
		}
		ids[i] = id
	}
	return ids, nil
}

// operator is who acts: --by, else ONCEFLOW_OPERATOR, else USER.
func (cfg dlqEnv) operator(by string) (string, error) {
	if who := cmp.Or(by, cfg.Operator, cfg.User); who != "" {
		return who, nil
	}
	return "", errors.New("say who acts: --by, ONCEFLOW_OPERATOR or USER")
}

func dlqReplay(ctx context.Context, inv invocation, cfg dlqEnv, args []string) error {
	fs := flagSet("dlq replay", "ID... | --consumer C --since T [flags]", `
Replays DLQ entries: publishes each entry's event again, with the same
event id, type and payload, to the consumer that gave up on it and to no
other. If the event was processed after all, that consumer's inbox drops it
as a duplicate. Each replay is recorded with who did it and when; an entry
already replayed or discarded is not replayed again.

What is published is the original message, re-read from its stream at
the sequence the entry names, after the inbox's owner check: an entry is
only what its writer says. An entry whose headers disagree with the DLQ
subject it was written on (the consumer that wrote it) is refused. An
entry whose original is gone (aged out of the stream), never existed or
is another event is refused unless --force, which publishes the entry's
own copy ('onceflow dlq show' says which entries these are).

A replay is refused when the event is older than the consumer's inbox
retention (INBOX_RETENTION of its service, recorded on the durable):
its processed_events row may have been deleted, so a replay of an event
that was processed after all would apply it twice. --past-retention
overrides this for an operator who has checked that it was not processed.

With --consumer and --since, every open entry of that consumer
dead-lettered since then is replayed; the refused ones are listed.`)
	consumer := fs.String("consumer", "", "replay every open entry of this consumer (with --since)")
	since := fs.String("since", "", "with --consumer: entries dead-lettered since, RFC 3339 or a duration ago")
	past := fs.Bool("past-retention", false, "replay even an event older than the consumer's inbox retention: it is applied again if it was processed after all")
	force := fs.Bool("force", false, "replay even an entry whose original cannot be re-read from its stream: its own copy, only what its writer says, is published")
	by := fs.String("by", "", "who replays (default ONCEFLOW_OPERATOR, else USER)")
	positional, err := parseMixed(fs, args, inv.stdout)
	if err != nil {
		return err
	}
	ids, err := entryIDs(positional)
	if err != nil {
		return usageError(fs, err.Error())
	}
	byFilter := *consumer != "" || *since != ""
	if len(ids) > 0 && byFilter || len(ids) == 0 && (*consumer == "" || *since == "") {
		return usageError(fs, "want entry IDs, or --consumer and --since")
	}
	who, err := cfg.operator(*by)
	if err != nil {
		return usageError(fs, err.Error())
	}
	opts := dlq.ReplayOptions{By: who, PastRetention: *past, Force: *force}
	store, closeNATS, err := dlqStore(cfg)
	if err != nil {
		return err
	}
	defer closeNATS()
	var results []dlq.ReplayResult
	if len(ids) == 0 {
		from, err := parseSince(*since, time.Now())
		if err != nil {
			return usageError(fs, err.Error())
		}
		results, err = store.ReplayAll(ctx, dlq.Filter{Consumer: *consumer, Since: from}, opts)
		if err != nil {
			return err
		}
	} else {
		for _, id := range ids {
			a, err := store.Replay(ctx, id, opts)
			results = append(results, dlq.ReplayResult{Entry: id, Action: a, Err: err})
		}
	}
	return reportResults(inv.stdout, results)
}

// reportResults prints what became of each entry and fails if any failed.
func reportResults(w io.Writer, results []dlq.ReplayResult) error {
	failed := 0
	for _, r := range results {
		switch {
		case r.Err != nil:
			failed++
			fmt.Fprintf(w, "entry %d: not replayed: %v\n", r.Entry, r.Err)
		case r.Action.Kind == dlq.Discarded:
			fmt.Fprintf(w, "entry %d: discarded\n", r.Entry)
		default:
			fmt.Fprintf(w, "entry %d: event %s replayed to %s (%s, sequence %d)\n",
				r.Entry, r.Action.EventID, r.Action.Consumer, r.Action.ReplaySubject, r.Action.ReplaySeq)
		}
	}
	if len(results) == 0 {
		fmt.Fprintln(w, "no open entry matched")
	}
	if failed > 0 {
		return fmt.Errorf("dlq: %d of %d entries not done", failed, len(results))
	}
	return nil
}

func dlqDiscard(ctx context.Context, inv invocation, cfg dlqEnv, args []string) error {
	fs := flagSet("dlq discard", "ID... --reason TEXT [--by WHO]", `
Discards DLQ entries: records, with who and why, that they are not to be
replayed (they stay in the DLQ until it expires, marked discarded).`)
	reason := fs.String("reason", "", "why (required)")
	by := fs.String("by", "", "who discards (default ONCEFLOW_OPERATOR, else USER)")
	positional, err := parseMixed(fs, args, inv.stdout)
	if err != nil {
		return err
	}
	ids, err := entryIDs(positional)
	switch {
	case err != nil:
		return usageError(fs, err.Error())
	case len(ids) == 0:
		return usageError(fs, "want entry IDs")
	case strings.TrimSpace(*reason) == "":
		return usageError(fs, "--reason is required")
	}
	who, err := cfg.operator(*by)
	if err != nil {
		return usageError(fs, err.Error())
	}
	store, closeNATS, err := dlqStore(cfg)
	if err != nil {
		return err
	}
	defer closeNATS()
	var results []dlq.ReplayResult
	for _, id := range ids {
		a, err := store.Discard(ctx, id, who, *reason)
		results = append(results, dlq.ReplayResult{Entry: id, Action: a, Err: err})
	}
	return reportResults(inv.stdout, results)
}

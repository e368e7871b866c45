package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/caarlos0/env/v11"
)

// command is a subcommand of onceflow.
type command struct {
	name string
	// usage is the synopsis after the command name, e.g. "[--seed]".
	usage   string
	summary string
	run     func(ctx context.Context, inv invocation, args []string) error
}

// invocation is what every command is given besides its arguments.
type invocation struct {
	stdout, stderr io.Writer
	logger         *slog.Logger
}

// LogConfig is how onceflow logs, read from the environment by every
// command.
type LogConfig struct {
	// Format is "text" or "json".
	Format string `env:"LOG_FORMAT" envDefault:"text"`
	// Level is debug, info, warn or error.
	Level slog.Level `env:"LOG_LEVEL" envDefault:"info"`
}

// Run runs the onceflow command line args (without the program name),
// writing its output to stdout and its logs and usage messages to stderr. It
// returns nil after printing help.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	logCfg, err := env.ParseAs[LogConfig]()
	if err != nil {
		return fmt.Errorf("log config: %w", err)
	}
	logger, err := newLogger(stderr, logCfg)
	if err != nil {
		return err
	}
	inv := invocation{stdout: stdout, stderr: stderr, logger: logger}

	cmds := commands()
	if len(args) == 0 {
		printUsage(stderr, cmds)
		return errors.New("no command given")
	}
	name, args := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) == 0 {
			printUsage(stdout, cmds)
			return nil
		}
		name, args = args[0], []string{"-h"}
	}
	for _, c := range cmds {
		if c.name == name {
			return c.run(ctx, inv, args)
		}
	}
	return fmt.Errorf("unknown command %q (see 'onceflow help')", name)
}

// commands returns every subcommand, in the order of the usage text.
func commands() []command {
	var cmds []command
	for _, s := range services() {
		cmds = append(cmds, command{
			name:    s.name,
			summary: "run the " + s.name + " service, configured from the environment",
			run:     s.command,
		})
	}
	return append(cmds,
		command{
			name:    "dev",
			usage:   "[--seed] [--data-dir DIR] [--durable] [--console-port N] [--nats-sync always|interval] [--cluster N] [--host HOST] [--http-port N] [--nats-port N] [--pg-port N] [--pprof ADDR]",
			summary: "run every service in one process on embedded NATS and a throwaway PostgreSQL",
			run:     runDev,
		},
		command{
			name:    "seed",
			summary: "write the demo's wallets, stock and prices into running services, as dev --seed (idempotent)",
			run:     runSeed,
		},
		command{
			name:    "provision",
			usage:   "[--wait D]",
			summary: "create or update the streams and durable consumers, as the provisioner (idempotent)",
			run:     runProvision,
		},
		command{
			name:    "nats-auth",
			usage:   "--dir DIR [--rotate]",
			summary: "write a NATS server's trust configuration and each identity's credentials",
			run:     runNATSAuth,
		},
		command{
			name:    "issuer",
			summary: "run the dev token issuer alone (POST /token, /.well-known/jwks.json), as dev runs it",
			run:     runIssuer,
		},
		command{
			name:    "migrate",
			usage:   "[service...]",
			summary: "migrate the named services' databases (default: all four) without serving",
			run:     runMigrate,
		},
		command{
			name:    "outbox",
			usage:   "redrive --since RFC3339|DURATION",
			summary: "mark outbox rows sent since a time for publishing again (after a broker lost acked messages)",
			run:     runOutbox,
		},
		command{name: "console", summary: "serve the operator's web console: orders as saga lanes, the pipeline's lag, the DLQ with replay, the audit", run: runConsole},
		command{name: "dlq", usage: dlqUsage, summary: "list, show, replay or discard dead-lettered events", run: runDLQ},
		command{name: "consumer", usage: consumerUsage, summary: "pause a durable of the saga during an incident (its orders expire at their deadlines), or resume it", run: runConsumer},
		command{name: "mail", usage: "retry [--order ID] [--since RFC3339|DURATION]", summary: "send FAILED e-mails again, with their Message-IDs (once the mail server is fixed)", run: runMail},
		command{name: "audit", usage: "[--wait D]", summary: "check the saga's invariants across the four databases and NATS; fail on any violation", run: runAudit},
		command{name: "loadgen", usage: "[--rate N/s] [--duration D] [--concurrency N] [--json FILE] [--histogram FILE.svg|png] [--order-url URL] …", summary: "drive a running onceflow over HTTP and report orders/s and placed→confirmed latency", run: runLoadgen},
		command{name: "nats-server", usage: "[-c FILE] [nats-server options]", summary: "run the nats-server onceflow is built with (onceflow dev --cluster runs its nodes with it)", run: runNATSServer},
		command{
			name:    "healthcheck",
			usage:   "[--timeout D] URL",
			summary: "GET URL and fail unless it answers 2xx (a container healthcheck without curl)",
			run:     runHealthcheck,
		},
		newCommand(),
	)
}

// commandUsage is the synopsis of the command name.
func commandUsage(name string) string {
	for _, c := range commands() {
		if c.name == name {
			return c.usage
		}
	}
	return ""
}

func printUsage(w io.Writer, cmds []command) {
	fmt.Fprint(w, `onceflow runs the order saga of onceflow: four services (order, payment,
inventory, notify) exchanging events over NATS JetStream with exactly-once
effects through a PostgreSQL inbox and outbox.

Usage:
  onceflow <command> [arguments]

Commands:
`)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run 'onceflow help <command>' for a command's arguments and environment.
Every command logs to stderr as LOG_FORMAT says (text or json; default text),
at LOG_LEVEL (debug, info, warn, error; default info).
`)
}

// newLogger is the one place where the log handler is chosen.
func newLogger(w io.Writer, cfg LogConfig) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: cfg.Level}
	switch strings.ToLower(cfg.Format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("LOG_FORMAT %q: want text or json", cfg.Format)
	}
}

// errHelp reports that a command printed its help: the command succeeded.
var errHelp = errors.New("help printed")

// flagSet returns the flag set of command name, whose usage text (for -h)
// is the synopsis followed by description and the flags.
func flagSet(name, usage, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors once, through the caller
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n%s\n", strings.TrimSpace("onceflow "+name+" "+usage), strings.TrimSpace(description))
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses args into fs. With -h it prints the usage to stdout and
// returns errHelp; on a bad flag it returns an error that says where the
// usage is.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return errHelp
	case err != nil:
		return usageError(fs, err.Error())
	}
	return nil
}

// usageError is a bad invocation of the command of fs.
func usageError(fs *flag.FlagSet, msg string) error {
	return fmt.Errorf("%s: %s (see 'onceflow help %s')", fs.Name(), msg, fs.Name())
}

// helped turns errHelp into success.
func helped(err error) error {
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

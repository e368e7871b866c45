package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/nats-io/nats-server/v2/server"
)

// runNATSServer runs a nats-server, the version onceflow is built with, as
// its own binary would with the same arguments: what `onceflow dev
// --cluster` runs its nodes with, so that each is a process of its own that
// can be killed by hand. It returns when the server shuts down (SIGTERM,
// SIGINT); nats-server handles the signals itself.
func runNATSServer(_ context.Context, inv invocation, args []string) error {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	help := false
	fs.Usage = func() {
		help = true
		fmt.Fprintf(inv.stdout, "Usage: onceflow nats-server %s\n\nRuns nats-server %s with nats-server's own options (see its documentation);\n'onceflow dev --cluster 3' runs its nodes with it.\n",
			commandUsage("nats-server"), server.VERSION)
	}
	opts, err := server.ConfigureOptions(fs, args, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	if help || opts == nil {
		return nil
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	s.ConfigureLogger()
	if err := server.Run(s); err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	s.WaitForShutdown()
	return nil
}

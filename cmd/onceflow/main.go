// Command onceflow runs the services of onceflow, one per process or all in
// one (onceflow dev), and their operational chores. Run 'onceflow help'.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/onceflow/onceflow/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // after the first signal, a second one kills at once
	err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "onceflow:", err)
		os.Exit(1)
	}
}

package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/notify"
)

// mailEnv is what `onceflow mail` reads from the environment.
type mailEnv struct {
	DatabaseURL string `env:"NOTIFY_DATABASE_URL,required,notEmpty"`
}

func runMail(ctx context.Context, inv invocation, args []string) error {
	args, help, err := subcommand(inv, "mail", "retry", args)
	if help || err != nil {
		return err
	}
	fs := flagSet("mail retry", "[--order ID] [--since RFC3339|DURATION]", `
Sends FAILED e-mails again: the e-mails of NOTIFY_DATABASE_URL that the
mailer gave up on (MAILER_MAX_ATTEMPTS failed attempts) go back to PENDING
with their attempts reset, and the notify service's mailer sends them as new,
under the same Message-ID, so that an e-mail that did reach its server before
is recognisably the same one. Run it once the cause (a mail server down, a
rejected sender) is fixed.`)
	orderFlag := fs.String("order", "", "only the e-mails of this order (its id)")
	sinceFlag := fs.String("since", "", "only e-mails created since this time: RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (90m)")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	var filter notify.RetryFilter
	if *orderFlag != "" {
		id, err := uuid.Parse(*orderFlag)
		if err != nil {
			return usageError(fs, fmt.Sprintf("--order %q: not an order id", *orderFlag))
		}
		filter.OrderID = id
	}
	if *sinceFlag != "" {
		since, err := parseSince(*sinceFlag, time.Now())
		if err != nil {
			return usageError(fs, err.Error())
		}
		filter.Since = since
	}
	cfg, err := env.ParseAs[mailEnv]()
	if err != nil {
		return fmt.Errorf("mail config: %w", err)
	}

	pool, err := postgres.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("mail retry: %w", err)
	}
	defer pool.Close()
	n, err := notify.RetryFailed(ctx, pool, filter)
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "%d failed e-mails set to be sent again; the notify service's mailer sends them.\n", n)
	return nil
}

// subcommand checks that args name sub, the one subcommand of command name,
// and returns the arguments after it. With -h it prints the command's usage
// and returns help = true.
func subcommand(inv invocation, name, sub string, args []string) (rest []string, help bool, err error) {
	switch {
	case len(args) > 0 && args[0] == sub:
		return args[1:], false, nil
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help"):
		fmt.Fprintf(inv.stdout, "Usage: onceflow %s %s\n\nRun 'onceflow %s %s -h' for its flags.\n", name, commandUsage(name), name, sub)
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("%s: want 'onceflow %s %s'", name, name, commandUsage(name))
}

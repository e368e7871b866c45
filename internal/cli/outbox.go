package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
)

// outboxEnv is what `onceflow outbox` reads from the environment.
type outboxEnv struct {
	DatabaseURL string `env:"DATABASE_URL,required,notEmpty"`
}

func runOutbox(ctx context.Context, inv invocation, args []string) error {
	args, help, err := subcommand(inv, "outbox", "redrive", args)
	if help || err != nil {
		return err
	}
	fs := flagSet("outbox redrive", "--since RFC3339|DURATION", `
Marks every row of DATABASE_URL's outbox that was sent at or after --since as
unsent, so that the service's relay publishes those events again. It is the
answer to a broker that lost messages it had acknowledged. Republishing is
harmless: the stream's duplicate window drops what it still remembers and
the consumers' inbox absorbs the rest. Rows whose partition was dropped
(sent longer than OUTBOX_RETENTION ago) are out of reach.`)
	sinceFlag := fs.String("since", "", "redrive rows sent since this time: RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (90m)")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	if *sinceFlag == "" {
		return usageError(fs, "--since is required")
	}
	since, err := parseSince(*sinceFlag, time.Now())
	if err != nil {
		return usageError(fs, err.Error())
	}
	cfg, err := env.ParseAs[outboxEnv]()
	if err != nil {
		return fmt.Errorf("outbox config: %w", err)
	}

	pool, err := postgres.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("outbox redrive: %w", err)
	}
	defer pool.Close()
	n, err := outbox.Redrive(ctx, pool, since)
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "%d outbox rows sent since %s marked for publishing again; the service's relay publishes them.\n",
		n, since.Format(time.RFC3339))
	return nil
}

// parseSince reads an RFC 3339 time, or a positive duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time or a positive duration", s)
	}
	return now.Add(-d), nil
}

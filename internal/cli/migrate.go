package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/postgres"
)

// databaseURL is one database's URL in the environment, read with a prefix
// ("ORDER_") or without.
type databaseURL struct {
	URL string `env:"DATABASE_URL"`
}

func runMigrate(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("migrate", commandUsage("migrate"), `
Applies the pending migrations of each named service's database (default:
all of them), as each service does at start-up, and exits.

Each service's database is <SERVICE>_DATABASE_URL (ORDER_DATABASE_URL,
PAYMENT_DATABASE_URL, INVENTORY_DATABASE_URL, NOTIFY_DATABASE_URL). When
exactly one service is named, DATABASE_URL serves if its own is unset, so
that 'onceflow migrate order' takes the environment of 'onceflow order'.`)
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	names := fs.Args()
	known := serviceNames()
	if len(names) == 0 {
		names = known
	}
	for i, name := range names {
		if !slices.Contains(known, name) {
			return usageError(fs, fmt.Sprintf("unknown service %q (want %s)", name, strings.Join(known, ", ")))
		}
		if slices.Contains(names[:i], name) {
			return usageError(fs, fmt.Sprintf("service %q named twice", name))
		}
	}
	urls, err := migrateURLs(names)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := migrateService(ctx, name, urls[name], inv.logger); err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "%s: migrated\n", name)
	}
	return nil
}

// migrateURLs reads the database URL of each service in names from the
// environment.
func migrateURLs(names []string) (map[string]string, error) {
	fallback, err := env.ParseAs[databaseURL]()
	if err != nil {
		return nil, fmt.Errorf("migrate config: %w", err)
	}
	urls := make(map[string]string, len(names))
	var missing []string
	for _, name := range names {
		prefix := strings.ToUpper(name) + "_"
		own, err := env.ParseAsWithOptions[databaseURL](env.Options{Prefix: prefix})
		if err != nil {
			return nil, fmt.Errorf("migrate config: %w", err)
		}
		switch {
		case own.URL != "":
			urls[name] = own.URL
		case len(names) == 1 && fallback.URL != "":
			urls[name] = fallback.URL
		default:
			missing = append(missing, prefix+"DATABASE_URL")
		}
	}
	if len(missing) > 0 {
		hint := ""
		if len(names) == 1 {
			hint = " or DATABASE_URL"
		}
		return nil, fmt.Errorf("migrate: set %s%s", strings.Join(missing, ", "), hint)
	}
	return urls, nil
}

func migrateService(ctx context.Context, name, url string, logger *slog.Logger) error {
	if err := postgres.MigrateService(ctx, url, name, logger.With("service", name)); err != nil {
		return fmt.Errorf("migrate %s: %w", name, err)
	}
	return nil
}

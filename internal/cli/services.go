package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/registry"
)

// service is one of the services as its command runs it.
type service struct {
	name string
	// config points to a zero value of the service's Config: the
	// environment variables the command reads are its env tags.
	config any
	// run loads the service's Config from the environment and runs it.
	run func(ctx context.Context, logger *slog.Logger) error
}

// services returns the registered services, the saga's four first.
func services() []service {
	var out []service
	for _, s := range registry.Services() {
		out = append(out, service{name: s.Name, config: s.Config, run: s.Run})
	}
	return out
}

func serviceNames() []string {
	var names []string
	for _, s := range services() {
		names = append(names, s.name)
	}
	return names
}

// envNames are the environment variables the command of s reads, with the
// ones every command reads.
func (s service) envNames() ([]string, error) {
	var names []string
	for _, cfg := range []any{s.config, new(LogConfig)} {
		params, err := env.GetFieldParams(cfg)
		if err != nil {
			return nil, fmt.Errorf("env tags of %T: %w", cfg, err)
		}
		for _, p := range params {
			names = append(names, p.Key)
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// command runs the service until ctx ends.
func (s service) command(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet(s.name, "", fmt.Sprintf(`
Runs the %s service, configured from the environment, until SIGINT or
SIGTERM. It migrates its database, waits for its durables (which 'onceflow
provision' creates: a service may not), and serves its HTTP API, inbox
consumers and outbox relay; on a signal it stops
consuming, finishes in-flight work, flushes its outbox and exits.

Environment:
%s`, s.name, s.envHelp()))
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	return s.run(ctx, inv.logger)
}

// envHelp lists the service's environment variables with their defaults.
func (s service) envHelp() string {
	var b []byte
	for _, cfg := range []any{s.config, new(LogConfig)} {
		params, err := env.GetFieldParams(cfg)
		if err != nil {
			continue // reported by envNames, which the tests call
		}
		for _, p := range params {
			switch {
			case p.Required:
				b = fmt.Appendf(b, "  %-24s (required)\n", p.Key)
			case p.HasDefaultValue:
				b = fmt.Appendf(b, "  %-24s default %s\n", p.Key, p.DefaultValue)
			default:
				b = fmt.Appendf(b, "  %s\n", p.Key)
			}
		}
	}
	return string(b)
}

package registry

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/app"
)

// Service is one service as the command line and onceflow dev run it.
type Service struct {
	Name string
	// Config points to a zero value of the service's Config: the
	// environment variables the service reads are its env tags.
	Config any
	// Run loads the service's Config from the process environment (its
	// LoadConfig) and runs the service until ctx ends.
	Run func(ctx context.Context, logger *slog.Logger) error
	// RunWith reads the service's Config from environ instead, as LoadConfig
	// reads the process environment, and runs the service serving ln instead
	// of listening on HTTP_ADDR, after configure has adjusted what the
	// environment cannot say (e.g. a TracerProvider).
	RunWith func(ctx context.Context, environ map[string]string, ln net.Listener, logger *slog.Logger, configure ...func(*app.Config)) error
}

// Of adapts a service package to a Service: load is its LoadConfig, run its
// Run, and base reaches the app.Config embedded in its Config.
func Of[C any](name string, load func() (C, error), run func(context.Context, C, *slog.Logger) error, base func(*C) *app.Config) Service {
	return Service{
		Name:   name,
		Config: new(C),
		Run: func(ctx context.Context, logger *slog.Logger) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			return run(ctx, cfg, logger)
		},
		RunWith: func(ctx context.Context, environ map[string]string, ln net.Listener, logger *slog.Logger, configure ...func(*app.Config)) error {
			cfg, err := env.ParseAsWithOptions[C](env.Options{Environment: environ})
			if err != nil {
				return fmt.Errorf("config: %w", err)
			}
			base(&cfg).HTTPListener = ln
			for _, f := range configure {
				f(base(&cfg))
			}
			return run(ctx, cfg, logger)
		},
	}
}

// Names returns the names of Services, in order.
func Names() []string {
	var names []string
	for _, s := range Services() {
		names = append(names, s.Name)
	}
	return names
}

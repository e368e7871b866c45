package dev

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/services/inventory"
	"github.com/onceflow/onceflow/services/notify"
	"github.com/onceflow/onceflow/services/order"
	"github.com/onceflow/onceflow/services/payment"
)

// service is one of the four services as Start runs it.
type service struct {
	name string
	// run reads the service's configuration from environ, as its LoadConfig
	// reads the process environment, and runs it serving ln.
	run func(ctx context.Context, environ map[string]string, ln net.Listener, logger *slog.Logger) error
}

// all returns the four services in the order of Env.Services.
func all() []service {
	return []service{
		serviceOf(order.Name, order.Run, func(c *order.Config) *app.Config { return &c.Config }),
		serviceOf(payment.Name, payment.Run, func(c *payment.Config) *app.Config { return &c.Config }),
		serviceOf(inventory.Name, inventory.Run, func(c *inventory.Config) *app.Config { return &c.Config }),
		serviceOf(notify.Name, notify.Run, func(c *notify.Config) *app.Config { return &c.Config }),
	}
}

// serviceOf adapts a service's Run; base reaches the app.Config embedded in
// its Config, to hand it the listener.
func serviceOf[C any](name string, run func(context.Context, C, *slog.Logger) error, base func(*C) *app.Config) service {
	return service{
		name: name,
		run: func(ctx context.Context, environ map[string]string, ln net.Listener, logger *slog.Logger) error {
			cfg, err := env.ParseAsWithOptions[C](env.Options{Environment: environ})
			if err != nil {
				return fmt.Errorf("config: %w", err)
			}
			base(&cfg).HTTPListener = ln
			return run(ctx, cfg, logger)
		},
	}
}

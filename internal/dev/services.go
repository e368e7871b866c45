package dev

import (
	"context"
	"log/slog"
	"net"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/registry"
)

// service is one of the services as Start runs it.
type service struct {
	name string
	// run reads the service's configuration from environ, as its LoadConfig
	// reads the process environment, and runs it serving ln.
	run func(ctx context.Context, environ map[string]string, ln net.Listener, logger *slog.Logger, configure ...func(*app.Config)) error
}

// all returns the registered services in the order of Env.Services: the
// saga's four, then the services added later.
func all() []service {
	var out []service
	for _, s := range registry.Services() {
		out = append(out, service{name: s.Name, run: s.RunWith})
	}
	return out
}

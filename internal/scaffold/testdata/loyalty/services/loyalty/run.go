package loyalty

import (
	"context"
	"log/slog"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/streams"
)

// Name is the service's name: its event source, migration set and logs.
const Name = "loyalty"

// Run runs the loyalty service until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	return app.Run(ctx, Name, cfg.Config, logger, func(d app.Deps) (app.Spec, error) {
		s := New(d.Pool)
		return app.Spec{
			Subscriptions: s.Subscriptions(),
			Routes:        s.Routes,
		}, nil
	})
}

// Subscriptions are the durables the service consumes, as Run wires them;
// its conformance test runs the kit on this list (conformance.Wired).
func (s *Service) Subscriptions() []app.Subscription {
	return []app.Subscription{
		{
			Durable: streams.LoyaltyOrders, Handler: s.HandleOrderConfirmed,
			// One message per transaction, the reference path. For the fast
			// path, a batch per transaction (about 10x the events/s under
			// load, docs/performance.md), uncomment:
			// Batched: true,
		},
	}
}

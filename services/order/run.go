package order

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/streams"
)

// Name is the service's name: its event source, migration set and logs.
const Name = "order"

// Run runs the order service until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	return app.Run(ctx, Name, cfg.Config, logger, func(d app.Deps) (app.Spec, error) {
		// A config built in code is checked as LoadConfig checks one read
		// from the environment, before anything starts.
		if err := cfg.check(); err != nil {
			return app.Spec{}, err
		}
		s := New(d.Pool)
		s.deadline = cmp.Or(cfg.Deadline, DefaultDeadline)
		expirer := NewExpirer(d.Pool, ExpirerConfig{Interval: cfg.ExpiryInterval}, d.Logger)
		s.admission = NewAdmission(d.Pool, cfg.MaxOrdersInFlight, d.Logger)
		s.perCaller = cfg.perCaller()
		if err := d.Registry.Register(s.admission.Collector()); err != nil {
			return app.Spec{}, fmt.Errorf("register admission metrics: %w", err)
		}
		if err := d.Registry.Register(expirer.Collector()); err != nil {
			return app.Spec{}, fmt.Errorf("register expirer metrics: %w", err)
		}
		return app.Spec{
			// The pipelined relay: the saga waits on it at every hop.
			PipelinedRelay: true,
			Subscriptions:  s.Subscriptions(),
			Routes:         s.Routes,
			Public:         PublicRoutes(),
			Background:     []func(context.Context) error{s.admission.Run, expirer.Run},
		}, nil
	})
}

// Subscriptions are the durables the service consumes, as Run wires them;
// its conformance test runs the kit on this list (conformance.Wired).
func (s *Service) Subscriptions() []app.Subscription {
	return []app.Subscription{
		{Durable: streams.OrderPayments, Handler: s.handlePaymentEvent,
			Batched: true, BatchHandler: s.batchHandler(paymentTypes)},
		{Durable: streams.OrderInventory, Handler: s.handleInventoryEvent,
			Batched: true, BatchHandler: s.batchHandler(inventoryTypes)},
	}
}

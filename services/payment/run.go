package payment

import (
	"context"
	"log/slog"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/streams"
)

// Name is the service's name: its event source, migration set and logs.
const Name = "payment"

// Run runs the payment service until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	return app.Run(ctx, Name, cfg.Config, logger, func(d app.Deps) (app.Spec, error) {
		s := New(d.Pool)
		return app.Spec{
			// The pipelined relay: the saga waits on it at every hop.
			PipelinedRelay: true,
			Subscriptions:  s.Subscriptions(),
			Routes:         s.Routes,
		}, nil
	})
}

// Subscriptions are the durables the service consumes, as Run wires them;
// its conformance test runs the kit on this list (conformance.Wired).
func (s *Service) Subscriptions() []app.Subscription {
	return []app.Subscription{
		{Durable: streams.PaymentOrders, Handler: s.HandleOrderPlaced,
			Batched: true, BatchHandler: s.HandleOrderPlacedBatch},
		{Durable: streams.PaymentInventory, Handler: s.HandleStockRejected,
			Batched: true, BatchHandler: s.HandleStockRejectedBatch},
		{Durable: streams.PaymentExpiries, Handler: s.HandleOrderExpired,
			Batched: true, BatchHandler: s.HandleOrderExpiredBatch},
	}
}

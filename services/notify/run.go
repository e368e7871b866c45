package notify

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/streams"
)

// Name is the service's name: its event source, migration set and logs.
const Name = "notify"

// Run runs the notify service until ctx is done: its consumer of the order
// milestones, its HTTP API and its mailer.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	return app.Run(ctx, Name, cfg.Config, logger, func(d app.Deps) (app.Spec, error) {
		sender, err := cfg.sender(d.Logger)
		if err != nil {
			return app.Spec{}, err
		}
		s := New(d.Pool)
		m := NewMailer(d.Pool, sender, MailerConfig{
			PollInterval: cfg.MailerPollInterval,
			MaxAttempts:  cfg.MailerMaxAttempts,
			RetryBackoff: cfg.MailerRetryBackoff,
			BatchSize:    cfg.MailerBatchSize,
			Concurrency:  cfg.MailerConcurrency,
		}, d.Logger)
		if err := d.Registry.Register(m.Collector()); err != nil {
			return app.Spec{}, fmt.Errorf("register mailer metrics: %w", err)
		}
		return app.Spec{
			// The pipelined relay: the saga waits on it at every hop.
			PipelinedRelay: true,
			Subscriptions:  s.Subscriptions(),
			Routes:         s.Routes,
			Background:     []func(context.Context) error{m.Run},
		}, nil
	})
}

// sender is the mailer's Sender: the configured one, else SMTP when an
// address is set, else the log.
func (c Config) sender(logger *slog.Logger) (Sender, error) {
	switch {
	case c.Sender != nil:
		return c.Sender, nil
	case c.SMTPAddr != "":
		return NewSMTPSender(c.SMTPAddr, cmp.Or(c.MailFrom, DefaultMailFrom))
	}
	return NewLogSender(logger.With("component", "log-sender")), nil
}

// Subscriptions are the durables the service consumes, as Run wires them;
// its conformance test runs the kit on this list (conformance.Wired).
func (s *Service) Subscriptions() []app.Subscription {
	return []app.Subscription{
		{Durable: streams.NotifyOrders, Handler: s.HandleOrderMilestone,
			Batched: true, BatchHandler: s.HandleOrderMilestoneBatch},
	}
}

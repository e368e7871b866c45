package inbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// Outcome is how a delivered message was settled.
type Outcome string

// The outcomes an Observer is told of.
const (
	OutcomeProcessed    Outcome = "processed"     // committed and acked
	OutcomeDuplicate    Outcome = "duplicate"     // processed (acked) or dead-lettered (terminated) before
	OutcomeRetried      Outcome = "retried"       // naked for a redelivery
	OutcomeDeadLettered Outcome = "dead_lettered" // copied to the DLQ and terminated
	// OutcomeDeadLetterRefused is a copy to the DLQ that was refused (the
	// durable's budget there is spent, or NATS failed): the message is
	// retried, not dropped.
	OutcomeDeadLetterRefused Outcome = "dead_letter_refused"
	// OutcomeExhausted: dead-lettered on a delivery past the consumer's
	// budget, without its handler: the deliveries that ran the handler never
	// settled, e.g. the process died in each (exhausted.go).
	OutcomeExhausted Outcome = "exhausted"
)

// Observer is told what a Consumer does, for metrics and tracing; package
// app implements it with Prometheus and OpenTelemetry. Its methods are
// called concurrently from the consumer's workers, on the hot path: they
// must be quick and must not fail.
type Observer interface {
	// Handle is called as the handler of ev starts. The context it returns
	// is the handler's (e.g. with a span). done is called once, with the
	// handler's error, as it returns.
	Handle(ctx context.Context, ev event.Envelope) (_ context.Context, done func(error))
	// HandleBatch is Handle for a call of the BatchHandler with evs; done
	// is called when its queued writes were sent with the COMMIT (their
	// failure is the call's), or at once if it failed.
	HandleBatch(ctx context.Context, evs []event.Envelope) (_ context.Context, done func(error))
	// Transaction is called after each inbox transaction, with the number
	// of messages it carried, its duration from begin to commit or
	// rollback, and why it rolled back: err is nil if it committed, or
	// had nothing to commit (an unbatched duplicate).
	Transaction(messages int, d time.Duration, err error)
	// Settled is called as a message is acked, naked or dead-lettered: for
	// OutcomeProcessed after its transaction committed and before its ack
	// is sent (the window a crash leaves a committed event unacknowledged,
	// where the end-to-end fault suite kills the process). ev is zero for a
	// message that could not be decoded; deliveries is how often the
	// message was delivered, this time included.
	Settled(ev event.Envelope, outcome Outcome, deliveries uint64)
}

// nopObserver is the Observer of a Consumer configured without one.
type nopObserver struct{}

func (nopObserver) Handle(ctx context.Context, _ event.Envelope) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (nopObserver) HandleBatch(ctx context.Context, _ []event.Envelope) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (nopObserver) Transaction(int, time.Duration, error)   {}
func (nopObserver) Settled(event.Envelope, Outcome, uint64) {}

// handle runs the handler for ev on tx and tells the Observer of the call.
// A panic in the handler comes back as its error.
func (c *Consumer) handle(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	ctx, done := c.cfg.Observer.Handle(ctx, ev)
	err := panics.Recover(func() error { return c.handler(ctx, tx, ev) })
	done(err)
	return err
}

// handleBatch runs the BatchHandler for evs and tells the Observer of the
// call, with the failure of its queued writes once writes is sent (with the
// COMMIT, which always sends them, whatever happened before).
func (c *Consumer) handleBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	ctx, done := c.cfg.Observer.HandleBatch(ctx, evs)
	if err := panics.Recover(func() error { return c.cfg.BatchHandler(ctx, tx, evs, writes) }); err != nil {
		done(err)
		return err
	}
	writes.AfterSend(done)
	return nil
}

// eventLogger is c's logger with what identifies d's event: its id, its
// subject (the order) and its trace.
func (c *Consumer) eventLogger(d *delivery) *slog.Logger {
	if d.ev.ID == uuid.Nil {
		return c.logger // not decoded
	}
	attrs := []any{"event_id", d.ev.ID, "order_id", d.ev.Subject}
	if id := telemetry.TraceID(d.ev.TraceParent); id != "" {
		attrs = append(attrs, "trace_id", id)
	}
	return c.logger.With(attrs...)
}

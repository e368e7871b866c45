package inbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// Outcome is how a delivered message was settled.
type Outcome string

// The outcomes an Observer is told of.
const (
	OutcomeProcessed    Outcome = "processed"     // committed and acked
	OutcomeDuplicate    Outcome = "duplicate"     // processed before; acked without the handler
	OutcomeRetried      Outcome = "retried"       // naked for a redelivery
	OutcomeDeadLettered Outcome = "dead_lettered" // copied to the DLQ and terminated
)

// Observer is told what a Consumer does, for metrics and tracing; package
// app implements it with Prometheus and OpenTelemetry. Its methods are
// called concurrently from the consumer's workers, on the hot path: they
// must be quick and must not fail.
type Observer interface {
	// Handle is called as the handler of ev starts. The context it returns
	// is the handler's (e.g. with a span); done is called with the
	// handler's error once it returned.
	Handle(ctx context.Context, ev event.Envelope) (_ context.Context, done func(error))
	// HandleBatch is Handle for a call of the BatchHandler with evs.
	HandleBatch(ctx context.Context, evs []event.Envelope) (_ context.Context, done func(error))
	// Transaction is called after each inbox transaction, committed or
	// not (err), with the number of messages it carried and its duration
	// from begin to commit or rollback.
	Transaction(messages int, d time.Duration, err error)
	// Settled is called when a message is acked, naked or dead-lettered.
	// ev is zero for a message that could not be decoded; deliveries is how
	// often the message was delivered, this time included.
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

// observed returns h, telling obs of each call.
func observed(h Handler, obs Observer) Handler {
	if _, ok := obs.(nopObserver); ok {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		ctx, done := obs.Handle(ctx, ev)
		err := h(ctx, tx, ev)
		done(err)
		return err
	}
}

// observedBatch returns h, telling obs of each call; nil stays nil.
func observedBatch(h BatchHandler, obs Observer) BatchHandler {
	if _, ok := obs.(nopObserver); ok || h == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
		ctx, done := obs.HandleBatch(ctx, evs) // its queued writes are the commit's
		err := h(ctx, tx, evs, writes)
		done(err)
		return err
	}
}

// txTimer times one inbox transaction for the Observer.
type txTimer struct {
	obs   Observer
	start time.Time
	n     int
}

func (c *Consumer) startTx(messages int) txTimer {
	return txTimer{obs: c.cfg.Observer, start: time.Now(), n: messages}
}

// done reports the transaction; *errp is its error, nil if it committed.
func (t txTimer) done(errp *error) { t.obs.Transaction(t.n, time.Since(t.start), *errp) }

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

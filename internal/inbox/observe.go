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
	// is the handler's (e.g. with a span). done is called once, with the
	// handler's error, when its statements are answered: as it returns, or,
	// if it left writes queued (see Handler), when the round trip that
	// carries them returns, the next event's read or the COMMIT. The
	// failure of a queued write is the handler's error. A handler whose
	// transaction ended before its queued writes were sent did not fail.
	Handle(ctx context.Context, ev event.Envelope) (_ context.Context, done func(error))
	// HandleBatch is Handle for a call of the BatchHandler with evs, whose
	// queued writes go with the COMMIT.
	HandleBatch(ctx context.Context, evs []event.Envelope) (_ context.Context, done func(error))
	// Transaction is called after each inbox transaction, with the number
	// of messages it carried, its duration from begin to commit or
	// rollback, and why it rolled back: err is nil if it committed, or
	// had nothing to commit (an unbatched duplicate).
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

// handle runs the handler for ev on wb, which queues its writes as
// owner's, and tells the Observer of the call. The Observer learns the handler's
// outcome once its statements are answered: at once when it failed or left
// nothing queued, else when the round trip that carries its queued writes
// returns (the next event's read, or the COMMIT), so that a queued write
// that fails is the handler's failure there as it is for the inbox. end
// tells the Observer that a handler whose writes were never sent (its
// transaction ended first) did not fail; after the Observer was told, it
// does nothing.
func (c *Consumer) handle(ctx context.Context, wb *postgres.WriteBehindTx, owner int, ev event.Envelope) (end func(), err error) {
	if _, ok := c.cfg.Observer.(nopObserver); ok {
		return func() {}, c.handler(ctx, wb, ev)
	}
	ctx, done := c.cfg.Observer.Handle(ctx, ev)
	tell := once(done)
	// The failure of a write that this handler queued, if one failed.
	ownWriteErr := func() error {
		if werr := wb.Err(); werr != nil && werr.Owner == owner {
			return werr.Err
		}
		return nil
	}
	err = c.handler(ctx, wb, ev)
	switch {
	case wb.Err() != nil:
		// Its own queued write failed (which may be what failed it), or an
		// earlier event's did, and with it this handler's statement.
		tell(ownWriteErr())
	case err != nil || wb.Writes().Len() == 0:
		tell(err)
	default:
		wb.Writes().AfterSend(func(error) { tell(ownWriteErr()) })
	}
	return func() { tell(nil) }, err
}

// handleBatch runs the BatchHandler for evs and tells the Observer of the
// call, with the failure of its queued writes once writes is sent (with the
// COMMIT). end is handle's.
func (c *Consumer) handleBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) (end func(), err error) {
	ctx, done := c.cfg.Observer.HandleBatch(ctx, evs)
	tell := once(done)
	if err = c.cfg.BatchHandler(ctx, tx, evs, writes); err != nil {
		tell(err)
	} else {
		writes.AfterSend(tell)
	}
	return func() { tell(nil) }, err
}

// once returns done, which it calls the first time only.
func once(done func(error)) func(error) {
	told := false
	return func(err error) {
		if !told {
			told = true
			done(err)
		}
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

// done reports the transaction: err is nil if it committed.
func (t txTimer) done(err error) { t.obs.Transaction(t.n, time.Since(t.start), err) }

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

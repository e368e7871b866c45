package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/panics"
)

// maxAtomicBatch is the most messages nats-server takes in one atomic
// batch unless configured otherwise.
const maxAtomicBatch = 1000

// publishAll publishes the batches it receives, one after the other, until
// batches is closed. After a batch that could not be published to its end,
// it publishes nothing more: a later row of the same aggregate must not
// reach the stream before the one that could not be sent.
func (r *Relay) publishAll(ctx context.Context, batches <-chan *batch) {
	var stopped error
	for b := range batches {
		if stopped == nil {
			r.publish(ctx, b)
			stopped = b.pubErr
		} else {
			b.pubErr = fmt.Errorf("not published, behind a failed publish: %w", stopped)
		}
		close(b.published)
	}
}

// publish publishes the rows of b in order. It stops at the first row that
// cannot be sent, and when ctx is done.
//
// A batch of at least AtomicBatchMin rows goes as atomic batches of at most
// maxAtomicBatch messages, each acknowledged before the next is sent, so
// that a refused one, which stored none of its messages, has none of the
// rows behind it stored ahead of it. Any other batch is published one
// message at a time without waiting for the acks.
func (r *Relay) publish(ctx context.Context, b *batch) {
	b.start = time.Now()
	b.deadline = b.start.Add(r.cfg.PublishTimeout)
	if r.tracer != nil {
		b.spans = make([]trace.Span, 0, len(b.rows))
	}
	// A panic fails the batch like a publish that failed: its rows stay
	// unsent, and the flush, on the other goroutine, carries on.
	b.pubErr = panics.Recover(func() error { return r.publishRows(ctx, b) })
	b.handed = time.Now()
}

// publishRows is publish's work; it returns why it stopped before the end
// of b's rows.
func (r *Relay) publishRows(ctx context.Context, b *batch) error {
	if r.cfg.AtomicBatchMin == 0 || len(b.rows) < r.cfg.AtomicBatchMin {
		return r.publishEach(ctx, b, b.rows)
	}
	for lo := 0; lo < len(b.rows); lo += maxAtomicBatch {
		err := r.publishAtomic(ctx, b, b.rows[lo:min(lo+maxAtomicBatch, len(b.rows))])
		if errors.Is(err, jetstreamext.ErrBatchPublishDuplicateMsgID) {
			// Some of its messages were stored before (a relay died before
			// it marked them, or they were re-driven): the broker refuses
			// them twice in an atomic batch and drops them published one at
			// a time. Nothing behind the batch has been published yet.
			r.logger.DebugContext(ctx, "atomic batch refused for a message stored before; publishing a message at a time", "events", len(b.rows)-lo)
			if r.tracer != nil {
				for _, span := range b.spans[lo:] {
					endSpan(span, err)
				}
				b.spans = b.spans[:lo]
			}
			return r.publishEach(ctx, b, b.rows[lo:])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// publishEach publishes rows, the last of b, one message at a time without
// waiting for their acks.
func (r *Relay) publishEach(ctx context.Context, b *batch, rows []dbsqlc.ClaimRow) error {
	b.futures = make([]jetstream.PubAckFuture, 0, len(rows))
	for _, row := range rows {
		msg, err := r.nextMessage(ctx, b, row)
		if err != nil {
			return err
		}
		f, err := r.js.PublishMsgAsync(msg, r.noRetry)
		if err != nil {
			return fmt.Errorf("publish event %s: %w", row.EventID, err)
		}
		b.futures = append(b.futures, f)
	}
	return nil
}

// publishAtomic publishes rows, the next of b, as one atomic batch
// (jetstreamext, ADR-50): every message but the last as a plain NATS
// publish, the last with the commit, whose ack stands for the batch. It
// waits for that ack, and counts the rows stored.
func (r *Relay) publishAtomic(ctx context.Context, b *batch, rows []dbsqlc.ClaimRow) error {
	msgs := make([]*nats.Msg, len(rows))
	for i, row := range rows {
		msg, err := r.nextMessage(ctx, b, row)
		if err != nil {
			return err
		}
		msgs[i] = msg
	}
	pctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	// Without flow control: the library would wait for an ack of the first
	// message, a round trip per batch that a batch of at most
	// maxAtomicBatch messages does not need.
	if _, err := jetstreamext.PublishMsgBatch(pctx, r.js, msgs, jetstreamext.BatchFlowControl{}); err != nil {
		return fmt.Errorf("publish events %s to %s as an atomic batch: %w", rows[0].EventID, rows[len(rows)-1].EventID, err)
	}
	b.stored += len(rows)
	return nil
}

// nextMessage makes the message of row, the next of b, and marks b
// attempted; it fails when row cannot be sent or ctx is done.
func (r *Relay) nextMessage(ctx context.Context, b *batch, row dbsqlc.ClaimRow) (*nats.Msg, error) {
	if ctx.Err() != nil {
		return nil, fmt.Errorf("publish event %s: halted", row.EventID)
	}
	msg, err := message(row)
	if err != nil {
		return nil, err
	}
	if r.tracer != nil {
		b.spans = append(b.spans, r.startSend(ctx, row, msg))
	}
	b.attempted = true
	return msg, nil
}

// message is the NATS message of an outbox row. Its Nats-Msg-Id is the
// event id (see event.Envelope.Msg), which the broker deduplicates on. The
// subject is the one the row was written with, so that the subject an event
// travels on is decided once, at Enqueue.
func message(row dbsqlc.ClaimRow) (*nats.Msg, error) {
	env := event.Envelope{
		ID:          row.EventID,
		Type:        event.Type(row.EventType),
		Source:      row.Source,
		Subject:     row.Subject,
		Time:        row.EventTime,
		Data:        row.Data,
		TraceParent: row.Traceparent,
	}
	msg, err := env.Msg()
	if err != nil {
		// Only a binary older than the one that wrote the row can fail
		// here. The row blocks the outbox rather than being skipped, which
		// would lose it or break its aggregate's order; Lag shows it.
		return nil, fmt.Errorf("outbox row %d: %w", row.ID, err)
	}
	msg.Subject = row.NatsSubject
	return msg, nil
}

package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/internal/streams"
)

// Headers a dead-lettered message carries besides the original's.
const (
	HeaderDLQReason     = "Onceflow-Dlq-Reason"     // why it could not be processed
	HeaderDLQConsumer   = "Onceflow-Dlq-Consumer"   // the durable that gave up on it
	HeaderDLQStream     = "Onceflow-Dlq-Stream"     // the stream it is stored in
	HeaderDLQStreamSeq  = "Onceflow-Dlq-Stream-Seq" // its sequence there
	HeaderDLQDeliveries = "Onceflow-Dlq-Deliveries" // how often it was delivered
	HeaderDLQSubject    = "Onceflow-Dlq-Subject"    // the subject it was published on
)

// maxReasonLen keeps a reason header readable; error chains can be long.
const maxReasonLen = 1024

// ack counts and acks d's message, whose event was processed (its
// transaction committed) or is a duplicate, and returns outcome.
func (c *Consumer) ack(ctx context.Context, d *delivery, outcome Outcome) Outcome {
	if outcome == OutcomeProcessed {
		c.processed.Add(1)
	} else {
		c.duplicates.Add(1)
		c.logger.DebugContext(ctx, "duplicate dropped", "event_id", d.ev.ID, "stream_seq", d.meta.Sequence.Stream)
	}
	c.cfg.Observer.Settled(d.ev, outcome, d.meta.NumDelivered)
	if c.skipSettle != nil && c.skipSettle(d.ev, outcome) {
		return outcome // as if the process died before the ack
	}
	if err := d.msg.Ack(); err != nil {
		c.eventLogger(d).WarnContext(ctx, "ack failed; the redelivery will be dropped as a duplicate", "err", err)
	}
	return outcome
}

// fail settles d's message, which failed with err and had nothing
// committed: a permanent failure, or the last delivery of one that is not,
// is dead-lettered; any other is naked, to come again after a backoff.
func (c *Consumer) fail(ctx context.Context, d *delivery, err error) Outcome {
	if d.meta == nil {
		c.logger.ErrorContext(ctx, "message without JetStream metadata dropped", "subject", d.msg.Subject(), "err", err)
		return OutcomeRetried // it could not be acked: if it was a delivery, it comes again
	}
	if c.skipSettle != nil && c.skipSettle(d.ev, OutcomeRetried) {
		return OutcomeRetried // as if the process died before settling it
	}
	if stack := panics.Stack(err); stack != nil {
		c.eventLogger(d).ErrorContext(ctx, "handler panicked", "deliveries", d.meta.NumDelivered, "err", err, "stack", string(stack))
	}
	switch {
	case isPermanent(err):
		return c.deadLetter(ctx, d, OutcomeDeadLettered, err.Error())
	case c.lastTry(d): // the budget is spent (exhausted.go)
		return c.deadLetter(ctx, d, OutcomeDeadLettered, fmt.Sprintf("failed on each of %d deliveries, the last: %v", d.meta.NumDelivered, err))
	}
	c.eventLogger(d).WarnContext(ctx, "processing failed; retrying", "deliveries", d.meta.NumDelivered, "err", err)
	return c.nak(ctx, d)
}

// nak asks for d's message again after a delay that doubles with every
// delivery.
func (c *Consumer) nak(ctx context.Context, d *delivery) Outcome {
	c.retried.Add(1)
	c.cfg.Observer.Settled(d.ev, OutcomeRetried, d.meta.NumDelivered)
	if err := d.msg.NakWithDelay(nakDelay(c.cfg.NakDelay, d.meta.NumDelivered)); err != nil {
		c.logger.WarnContext(ctx, "nak failed; the message will be redelivered after the ack wait",
			"stream_seq", d.meta.Sequence.Stream, "err", err)
	}
	return OutcomeRetried
}

// maxNakDelay caps the exponential redelivery delay.
const maxNakDelay = time.Minute

// nakDelay doubles base with every delivery, up to maxNakDelay, so that a
// failing dependency is not hammered while it recovers.
func nakDelay(base time.Duration, delivered uint64) time.Duration {
	d := base
	for i := uint64(1); i < delivered && d < maxNakDelay; i++ {
		d *= 2
	}
	return min(d, maxNakDelay)
}

// deadLetter copies d's message to the DLQ with the reason, then terminates
// it, and reports outcome (OutcomeDeadLettered, or OutcomeExhausted), or
// OutcomeDuplicate when the DLQ held its copy already. If the
// copy is refused (the DLQ is unreachable, or the durable's budget there is
// spent) the message is naked, never dropped uncopied: the server
// redelivers it however often it was delivered (exhausted.go).
func (c *Consumer) deadLetter(ctx context.Context, d *delivery, outcome Outcome, reason string) Outcome {
	dlq := c.dlqMsg(d.msg.Headers(), d.msg.Data(), d.msg.Subject(), d.meta.Stream, d.meta.Sequence.Stream, d.meta.NumDelivered, reason)
	stored, dup := c.publishDeadLetter(ctx, d, dlq)
	if !stored {
		return OutcomeRetried
	}
	settled := outcome
	if dup {
		// An earlier delivery copied it and was counted: its term was
		// lost, its process died before the term, or the server delivered
		// it again while that delivery waited in hand past its ack wait.
		settled = OutcomeDuplicate
		c.duplicates.Add(1)
		c.logger.DebugContext(ctx, "already dead-lettered; duplicate dropped", "event_id", d.ev.ID, "stream_seq", d.meta.Sequence.Stream)
	} else {
		c.deadLettered.Add(1)
		c.eventLogger(d).WarnContext(ctx, "message dead-lettered",
			"subject", d.msg.Subject(), "stream_seq", d.meta.Sequence.Stream, "deliveries", d.meta.NumDelivered, "reason", reason)
	}
	c.cfg.Observer.Settled(d.ev, settled, d.meta.NumDelivered)
	if c.skipSettle != nil && c.skipSettle(d.ev, outcome) {
		return settled // as if the term was lost
	}
	if err := d.msg.TermWithReason("dead-lettered"); err != nil {
		c.logger.WarnContext(ctx, "term failed; the redelivery will find its copy in the DLQ and be dropped as a duplicate",
			"stream_seq", d.meta.Sequence.Stream, "err", err)
	}
	return settled
}

// HeaderDLQBodyDropped is the size of a body too large for the DLQ: the
// entry holds its headers only, and a replay re-reads the original.
const HeaderDLQBodyDropped = "Onceflow-Dlq-Body-Dropped"

// publishDeadLetter stores dlq, and reports whether the DLQ holds it, and
// whether it held it already (dup: the DLQ dropped this copy by its message
// id). A refusal is logged and counted (OutcomeDeadLetterRefused) and the
// message naked with the usual back-off, to be dead-lettered again on its
// next delivery.
func (c *Consumer) publishDeadLetter(ctx context.Context, d *delivery, dlq *nats.Msg) (stored, dup bool) {
	ack, err := c.js.PublishMsg(ctx, dlq)
	if errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) && dlq.Data != nil {
		dlq.Header.Set(HeaderDLQBodyDropped, strconv.Itoa(len(dlq.Data)))
		dlq.Data = nil
		ack, err = c.js.PublishMsg(ctx, dlq)
	}
	if err == nil {
		return true, ack.Duplicate
	}
	c.cfg.Observer.Settled(d.ev, OutcomeDeadLetterRefused, d.meta.NumDelivered)
	c.eventLogger(d).ErrorContext(ctx, "dead-lettering refused; retrying",
		"stream_seq", d.meta.Sequence.Stream, "deliveries", d.meta.NumDelivered, "err", err)
	if err := d.msg.NakWithDelay(nakDelay(c.cfg.NakDelay, d.meta.NumDelivered)); err != nil {
		c.logger.WarnContext(ctx, "nak failed; the message will be redelivered after the ack wait",
			"stream_seq", d.meta.Sequence.Stream, "err", err)
	}
	return false, false
}

// dlqMsg is the DLQ copy of the message with headers orig and data,
// published on subject and stored in stream at seq, and delivered
// deliveries times.
func (c *Consumer) dlqMsg(orig nats.Header, data []byte, subject, stream string, seq, deliveries uint64, reason string) *nats.Msg {
	reason = strings.Join(strings.Fields(reason), " ") // no line breaks in a header
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	h := nats.Header{}
	for k, v := range orig {
		// Nats-* headers instructed the server that stored the original
		// (dedup id, expected sequences, TTL, rollup); copied, they would act
		// again on the DLQ stream.
		if !strings.HasPrefix(k, "Nats-") {
			h[k] = slices.Clone(v)
		}
	}
	h.Set(HeaderDLQReason, reason)
	h.Set(HeaderDLQConsumer, c.cfg.Durable)
	h.Set(HeaderDLQStream, stream)
	h.Set(HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	h.Set(HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	h.Set(HeaderDLQSubject, subject)
	// One id per stored message: dead-lettering it again (a term that was
	// lost, a crash after the publish) is dropped by the DLQ's dedup.
	h.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s:%d", c.cfg.Durable, seq))
	return &nats.Msg{Subject: streams.DLQSubjectPrefix + c.cfg.Durable, Header: h, Data: data}
}

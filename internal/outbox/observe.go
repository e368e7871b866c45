package outbox

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// tracerName is the instrumentation scope of the outbox's spans.
const tracerName = "github.com/onceflow/onceflow/internal/outbox"

// RelayObserver is told what a Relay publishes, for metrics; package app
// implements it with Prometheus. Its methods are called from the relay's
// goroutine and must be quick.
type RelayObserver interface {
	// Published is called after each batch that published anything: how
	// many events the broker acknowledged, the time from the first publish
	// to the last ack, and the error that cut the batch short, if any. A
	// batch in flight behind one that failed is cut short by that failure:
	// none of its events counts as acknowledged.
	Published(acked int, d time.Duration, err error)
	// Acked is called for each acknowledged event with its type and its
	// age at the ack: how long it waited in the outbox.
	Acked(typ event.Type, age time.Duration)
	// Step is called with the time each step of a batch took, to find
	// where a hop's time goes: StepWait (from its oldest row's
	// transaction start to the claim that found it), StepClaim (the
	// claim's round trip, with the records that ride on it), StepPublish
	// (handing its messages to the client), StepAck (from its last
	// publish to its last ack) and StepRecord (a record sent on its own).
	Step(step string, d time.Duration)
}

// The steps of RelayObserver.Step.
const (
	StepWait    = "wait"
	StepClaim   = "claim"
	StepPublish = "publish"
	StepAck     = "ack"
	StepRecord  = "record"
)

type nopRelayObserver struct{}

func (nopRelayObserver) Published(int, time.Duration, error) {}
func (nopRelayObserver) Acked(event.Type, time.Duration)     {}
func (nopRelayObserver) Step(string, time.Duration)          {}

// traceEnqueue starts the span of writing ev to the outbox and records its
// trace context in ev.TraceParent, so that the relay's publish, and the
// consumers behind it, continue the trace. The span is a child of ctx's
// span; but when ev already carries a trace that ctx's span is not part of
// (e.g. set by event.Caused outside any span), that trace is kept and the
// span becomes its child. end ends the span with the write's error.
func traceEnqueue(ctx context.Context, ev event.Envelope, subject string) (_ event.Envelope, end func(error)) {
	// The tracer of the caller's span: Enqueue records nothing unless its
	// caller does.
	tracer := telemetry.Tracer(ctx, tracerName)
	parent := trace.SpanContextFromContext(ctx)
	if ev.TraceParent != "" {
		carried := trace.SpanContextFromContext(telemetry.ContextWithTraceParent(context.Background(), ev.TraceParent))
		if carried.IsValid() && (!parent.IsValid() || carried.TraceID() != parent.TraceID()) {
			ctx = trace.ContextWithRemoteSpanContext(ctx, carried)
		}
	}
	ctx, span := tracer.Start(ctx, "create "+subject,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(messagingAttrs(ev.ID.String(), string(ev.Type), ev.Subject, subject)...))
	if tp := telemetry.TraceParent(ctx); tp != "" {
		ev.TraceParent = tp
	}
	return ev, func(err error) { endSpan(span, err) }
}

// startSend starts the span of publishing row as msg, a child of the span
// that wrote the row, and puts the span's trace context in msg's header:
// the consumers' spans are its children. A relay without a TracerProvider
// starts no span, and msg carries the trace context the row was written
// with, which is what a no-op span would put there.
func (r *Relay) startSend(ctx context.Context, row dbsqlc.ClaimRow, msg *nats.Msg) trace.Span {
	ctx, span := r.tracer.Start(telemetry.ContextWithTraceParent(ctx, row.Traceparent), "send "+row.NatsSubject,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(messagingAttrs(row.EventID.String(), row.EventType, row.Subject, row.NatsSubject)...))
	if tp := telemetry.TraceParent(ctx); tp != "" {
		msg.Header.Set(telemetry.HeaderTraceParent, tp)
	}
	return span
}

// observePublish ends the spans of b's publishes, if any, and reports b to
// the observer: the first acked rows were acknowledged, the rest failed with
// err.
func (r *Relay) observePublish(b *batch, acked int, err error) {
	now := time.Now()
	for i, span := range b.spans {
		if i < acked {
			span.End(trace.WithTimestamp(now))
		} else {
			endSpan(span, err)
		}
	}
	for _, row := range b.rows[:acked] {
		r.cfg.Observer.Acked(event.Type(row.EventType), now.Sub(row.EventTime))
	}
	if b.attempted {
		r.cfg.Observer.Published(acked, now.Sub(b.start), err)
		r.cfg.Observer.Step(StepPublish, b.handed.Sub(b.start))
		r.cfg.Observer.Step(StepAck, now.Sub(b.handed))
	}
}

func messagingAttrs(eventID, eventType, orderID, natsSubject string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.destination.name", natsSubject),
		attribute.String("messaging.message.id", eventID),
		attribute.String("cloudevents.event_type", eventType),
		attribute.String("cloudevents.event_subject", orderID),
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

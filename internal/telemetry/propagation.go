package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderTraceParent is the W3C trace context header.
const HeaderTraceParent = "traceparent"

// TraceParent returns the W3C traceparent of ctx's span, or "" when ctx has
// no valid span context.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier[HeaderTraceParent]
}

// ContextWithTraceParent returns ctx with the remote span context that
// traceparent names as its parent, or ctx unchanged when traceparent is
// empty or malformed: a bad header never fails the work it travels with.
func ContextWithTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{HeaderTraceParent: traceparent})
}

// TraceID returns the trace id in traceparent, or "" when it has none.
func TraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(ContextWithTraceParent(context.Background(), traceparent))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Tracer returns the tracer of the span in ctx, or a no-op tracer when ctx
// has none. Code that rides on a caller's context (outbox.Enqueue) traces
// with it, so that it needs no provider of its own and records nothing when
// its caller does not.
func Tracer(ctx context.Context, name string) trace.Tracer {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(name)
}

package telemetry

import (
	"context"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// logAttrsKey is the context key of the attributes added by WithLogAttrs.
type logAttrsKey struct{}

// WithLogAttrs returns ctx carrying attrs, which a LogHandler adds to every
// record logged with that context (e.g. the event id and the order id
// while an event is handled).
func WithLogAttrs(ctx context.Context, attrs ...slog.Attr) context.Context {
	prev, _ := ctx.Value(logAttrsKey{}).([]slog.Attr)
	return context.WithValue(ctx, logAttrsKey{}, append(slices.Clip(prev), attrs...))
}

// LogHandler wraps a slog.Handler: a record logged with a context gets the
// context's trace_id and span_id, when it has a span, and the attributes
// of WithLogAttrs.
type LogHandler struct {
	next slog.Handler
}

// NewLogHandler returns a LogHandler in front of next. Wrapping a
// LogHandler again returns it unchanged.
func NewLogHandler(next slog.Handler) slog.Handler {
	if h, ok := next.(LogHandler); ok {
		return h
	}
	return LogHandler{next: next}
}

// Enabled reports whether the wrapped handler handles level.
func (h LogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// Handle adds the context's attributes to r and passes it on.
func (h LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if attrs, ok := ctx.Value(logAttrsKey{}).([]slog.Attr); ok {
		r.AddAttrs(attrs...)
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a LogHandler whose wrapped handler has attrs.
func (h LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return LogHandler{next: h.next.WithAttrs(attrs)}
}

// WithGroup returns a LogHandler whose wrapped handler has the group name.
func (h LogHandler) WithGroup(name string) slog.Handler {
	return LogHandler{next: h.next.WithGroup(name)}
}

package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceflow/onceflow/internal/telemetry"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestTraceParentRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := telemetry.ContextWithTraceParent(context.Background(), parent)
	require.Equal(t, parent, telemetry.TraceParent(ctx))
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", telemetry.TraceID(parent))

	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		ctx := telemetry.ContextWithTraceParent(context.Background(), bad)
		require.Empty(t, telemetry.TraceParent(ctx), bad)
		require.Empty(t, telemetry.TraceID(bad), bad)
	}
}

func TestTracerFollowsTheCallersSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, span := tp.Tracer("test").Start(context.Background(), "caller")
	_, child := telemetry.Tracer(ctx, "callee").Start(ctx, "callee")
	child.End()
	span.End()
	require.Len(t, rec.Ended(), 2, "the callee traced with the caller's provider")

	_, none := telemetry.Tracer(context.Background(), "callee").Start(context.Background(), "nothing")
	require.False(t, none.SpanContext().IsValid(), "no caller span, no recording")
}

func TestLogHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil))).With("service", "order")
	require.IsType(t, telemetry.LogHandler{}, telemetry.NewLogHandler(logger.Handler()), "wrapping twice")

	ctx := telemetry.ContextWithTraceParent(context.Background(), parent)
	ctx = telemetry.WithLogAttrs(ctx, slog.String("event_id", "e1"), slog.String("order_id", "o1"))
	logger.InfoContext(ctx, "handled")
	require.Contains(t, buf.String(), `"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"`)
	require.Contains(t, buf.String(), `"span_id":"00f067aa0ba902b7"`)
	require.Contains(t, buf.String(), `"event_id":"e1","order_id":"o1"`)
	require.Contains(t, buf.String(), `"service":"order"`)

	buf.Reset()
	logger.Info("no context")
	require.NotContains(t, buf.String(), "trace_id")
	require.NotContains(t, buf.String(), "event_id")
}

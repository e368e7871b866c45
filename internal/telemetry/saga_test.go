package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestOrderSagaIsOneTrace places an order over HTTP on the four services of
// onceflow dev and follows it to CONFIRMED: every span about the order —
// the request, each outbox write and publish, each consumer's handling in
// every service — is in the request's trace, and each consumer's span is a
// child of the publish of the event it handled.
func TestOrderSagaIsOneTrace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })

	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := dev.Start(ctx, dev.Config{TracerProvider: tp}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	_, err = dev.Seed(ctx, e)
	require.NoError(t, err)

	body := `{"customer_email":"alice@example.com","items":[{"sku":"apple","quantity":1}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL("order")+"/orders", bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "trace-1")
	tok, err := e.Token("alice", false)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	var placed struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&placed))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// The last spans of the saga: notify handles the confirmation.
	wantConsumers := []string{streams.PaymentOrders, streams.InventoryPayments, streams.OrderPayments,
		streams.OrderInventory, streams.NotifyOrders}
	var spans []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		spans = aboutOrder(rec.Ended(), placed.ID)
		var confirmedNotified bool
		seen := map[string]bool{}
		for _, s := range spans {
			group := attr(s, "messaging.consumer.group.name")
			seen[group] = true
			if group == streams.NotifyOrders && attr(s, "messaging.destination.name") == "orders.confirmed.v1" {
				confirmedNotified = true
			}
		}
		for _, c := range wantConsumers {
			if !seen[c] {
				return false
			}
		}
		return confirmedNotified
	}, 30*time.Second, 20*time.Millisecond, "the saga's consumer spans did not all end")

	var root sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "POST /orders" && s.SpanKind() == trace.SpanKindServer {
			require.Nil(t, root, "one request, one server span")
			root = s
		}
	}
	require.NotNil(t, root)
	traceID := root.SpanContext().TraceID()

	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var names []string
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == traceID {
			byID[s.SpanContext().SpanID()] = s
			names = append(names, s.Name())
		}
	}
	for _, s := range spans {
		require.Equal(t, traceID, s.SpanContext().TraceID(), "span %q about the order is in another trace", s.Name())
	}
	for _, want := range []string{
		"create orders.placed.v1", "send orders.placed.v1", "process orders.placed.v1",
		"send payments.debited.v1", "process payments.debited.v1",
		"send inventory.reserved.v1", "process inventory.reserved.v1",
		"create orders.confirmed.v1", "send orders.confirmed.v1", "process orders.confirmed.v1",
	} {
		require.Contains(t, names, want)
	}
	// Each consumer span is the child of the publish of its event, which
	// descends from the request.
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		parent, ok := byID[s.Parent().SpanID()]
		require.True(t, ok, "the parent of %q is not in the trace", s.Name())
		require.Equal(t, "send "+attr(s, "messaging.destination.name"), parent.Name())
		require.True(t, descends(byID, s, root), "%q does not descend from the request", s.Name())
	}
}

// aboutOrder returns the spans about the order id.
func aboutOrder(spans []sdktrace.ReadOnlySpan, id string) []sdktrace.ReadOnlySpan {
	return slices.DeleteFunc(slices.Clone(spans), func(s sdktrace.ReadOnlySpan) bool {
		return attr(s, "cloudevents.event_subject") != id
	})
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.AsString()
		}
	}
	return ""
}

// descends reports whether root is an ancestor of s in byID.
func descends(byID map[trace.SpanID]sdktrace.ReadOnlySpan, s, root sdktrace.ReadOnlySpan) bool {
	for s != nil {
		if s.SpanContext().SpanID() == root.SpanContext().SpanID() {
			return true
		}
		s = byID[s.Parent().SpanID()]
	}
	return false
}

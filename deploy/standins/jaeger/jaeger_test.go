package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

// provider is an OpenTelemetry SDK tracer provider of service, exporting
// synchronously through exp.
func provider(t *testing.T, service string, exp sdktrace.SpanExporter) *sdktrace.TracerProvider {
	t.Helper()
	res, err := resource.New(t.Context(), resource.WithAttributes(attribute.String("service.name", service), attribute.String("host", "h1")))
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	return tp
}

type answer struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

func get(t *testing.T, u string, into any) int {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	var a answer
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
	if into != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(a.Data, into))
	}
	return resp.StatusCode
}

// TestTracesFromBothReceiversAreOneTrace: a span exported over OTLP/HTTP
// by one service and its child exported over OTLP/gRPC by another are one
// trace in the query API, found by the child's service and attribute.
func TestTracesFromBothReceiversAreOneTrace(t *testing.T) {
	t.Parallel()
	st := newStore(100)
	otlp := httptest.NewServer(otlpHandler(st, slog.New(slog.DiscardHandler)))
	t.Cleanup(otlp.Close)
	api := httptest.NewServer(queryHandler(st))
	t.Cleanup(api.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, grpcReceiver{st: st})
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	httpExp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(otlp.URL+"/v1/traces"))
	require.NoError(t, err)
	grpcExp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpoint(ln.Addr().String()), otlptracegrpc.WithInsecure())
	require.NoError(t, err)
	ctx, parent := provider(t, "svc-a", httpExp).Tracer("test").Start(t.Context(), "POST /orders")
	_, child := provider(t, "svc-b", grpcExp).Tracer("test").Start(ctx, "process orders.placed")
	child.SetAttributes(attribute.String("order", "o-1"), attribute.Int("lines", 3))
	child.End()
	parent.End()
	traceID := parent.SpanContext().TraceID().String()

	var services []string
	require.Equal(t, http.StatusOK, get(t, api.URL+"/api/services", &services))
	require.Equal(t, []string{"svc-a", "svc-b"}, services)
	var ops []string
	require.Equal(t, http.StatusOK, get(t, api.URL+"/api/services/svc-b/operations", &ops))
	require.Equal(t, []string{"process orders.placed"}, ops)

	var traces []trace
	q := url.Values{"service": {"svc-b"}, "tags": {`{"order":"o-1","lines":"3"}`}}
	require.Equal(t, http.StatusOK, get(t, api.URL+"/api/traces?"+q.Encode(), &traces))
	require.Len(t, traces, 1)
	tr := traces[0]
	require.Equal(t, traceID, tr.TraceID)
	require.Len(t, tr.Spans, 2)
	require.Len(t, tr.Processes, 2)
	require.Equal(t, "POST /orders", tr.Spans[0].OperationName, "sorted by start")
	require.Equal(t, "svc-a", tr.Processes[tr.Spans[0].ProcessID].ServiceName)
	require.Equal(t, "svc-b", tr.Processes[tr.Spans[1].ProcessID].ServiceName)
	require.Equal(t, []reference{{RefType: "CHILD_OF", TraceID: traceID, SpanID: parent.SpanContext().SpanID().String()}}, tr.Spans[1].References)

	for _, miss := range []url.Values{
		{"service": {"svc-a"}, "tag": {"order:o-1"}}, // the tag is on svc-b's span
		{"service": {"svc-b"}, "operation": {"other"}},
		{"service": {"svc-b"}, "tag": {"host:h2"}},
	} {
		require.Equal(t, http.StatusOK, get(t, api.URL+"/api/traces?"+miss.Encode(), &traces))
		require.Empty(t, traces, "%v", miss)
	}
	require.Equal(t, http.StatusOK, get(t, api.URL+"/api/traces?service=svc-a&tag=host:h1", &traces))
	require.Len(t, traces, 1, "a process's tag matches too")

	require.Equal(t, http.StatusOK, get(t, api.URL+"/api/traces/"+traceID, &traces))
	require.Len(t, traces[0].Spans, 2)
	require.Equal(t, http.StatusNotFound, get(t, api.URL+"/api/traces/00000000000000000000000000000001", nil))
	require.Equal(t, http.StatusBadRequest, get(t, api.URL+"/api/traces?operation=x", nil))
}

// TestKeepsTheNewestTraces: past its bound, the oldest trace goes.
func TestKeepsTheNewestTraces(t *testing.T) {
	t.Parallel()
	st := newStore(2)
	for _, id := range []string{"a1", "a2", "a1", "a3"} {
		st.add([]span{{TraceID: id, StartTime: 1, process: process{ServiceName: "s"}}})
	}
	_, ok := st.get("a1")
	require.False(t, ok)
	t2, ok := st.get("a2")
	require.True(t, ok)
	require.Len(t, t2.Spans, 1)
	found := st.find(query{service: "s", end: 2, limit: 10})
	require.Len(t, found, 2)
	require.Equal(t, "a3", found[0].TraceID, "newest first")
	require.Len(t, st.find(query{service: "s", end: 2, limit: 1}), 1)
	require.Empty(t, st.find(query{service: "s", start: 2, end: 3, limit: 10}))
}

package httpapi_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// TestObserve serves requests through the middleware: they are counted by
// route and status, replays are counted, a route-less request is labelled
// "unmatched", each traced request gets a server span that continues the
// caller's trace, and the error handler logs with that span's trace id.
func TestObserve(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	observe, err := httpapi.Observe(reg, tp)
	require.NoError(t, err)
	_, err = httpapi.Observe(reg, tp)
	require.Error(t, err, "registering twice is an error, not a panic")

	var logs bytes.Buffer
	logger := slog.New(telemetry.NewLogHandler(slog.NewTextHandler(&logs, nil)))
	e := httpapi.New(logger, observe)
	e.GET("/things/:id", func(c echo.Context) error {
		if c.Param("id") == "boom" {
			return errors.New("boom")
		}
		if c.Param("id") == "again" {
			c.Response().Header().Set(httpapi.HeaderReplayed, "true")
		}
		return c.String(http.StatusOK, "ok")
	})
	e.GET("/healthz", func(c echo.Context) error { return c.NoContent(http.StatusOK) })

	serve := func(path string, header ...string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rr := httptest.NewRecorder()
		e.ServeHTTP(rr, req)
		return rr.Code
	}
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.Equal(t, http.StatusOK, serve("/things/1", "traceparent", parent))
	require.Equal(t, http.StatusOK, serve("/things/again"))
	require.Equal(t, http.StatusInternalServerError, serve("/things/boom"))
	require.Equal(t, http.StatusNotFound, serve("/no/such/path"))
	require.Equal(t, http.StatusOK, serve("/healthz"))

	count := func(route, status string) float64 {
		return counter(t, reg, "onceflow_http_requests_total", map[string]string{
			"method": "GET", "route": route, "status": status,
		})
	}
	require.Equal(t, 2.0, count("/things/:id", "200"))
	require.Equal(t, 1.0, count("/things/:id", "500"))
	require.Equal(t, 1.0, count("unmatched", "404"))
	require.Equal(t, 1.0, count("/healthz", "200"))
	require.Equal(t, 1.0, counter(t, reg, "onceflow_http_idempotent_replays_total",
		map[string]string{"method": "GET", "route": "/things/:id"}))

	spans := rec.Ended()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	require.ElementsMatch(t, []string{"GET /things/:id", "GET /things/:id", "GET /things/:id", "GET unmatched"}, names,
		"probes are not traced")
	first := spans[0]
	require.Equal(t, trace.SpanKindServer, first.SpanKind())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", first.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", first.Parent().SpanID().String())

	var failed sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Status().Code.String() == "Error" {
			failed = s
		}
	}
	require.NotNil(t, failed)
	require.Contains(t, logs.String(), "request failed")
	require.Contains(t, logs.String(), "trace_id="+failed.SpanContext().TraceID().String())
}

// counter returns the value of the counter name with labels in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// A 500 is logged as an error; a refusal with a Retry-After (shedding load)
// is not, however many there are.
func TestErrorHandlerLogsFailuresNotRefusals(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	e := httpapi.New(slog.New(slog.NewTextHandler(&logs, nil)))
	e.GET("/boom", func(echo.Context) error { return errors.New("boom") })
	e.GET("/busy", func(echo.Context) error { return httpapi.Unavailable(time.Second, "too busy") })
	for path, status := range map[string]int{"/busy": http.StatusServiceUnavailable, "/boom": http.StatusInternalServerError} {
		rr := httptest.NewRecorder()
		e.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, status, rr.Code, path)
	}
	require.Contains(t, logs.String(), "level=ERROR msg=\"request failed\" method=GET path=/boom")
	require.NotContains(t, logs.String(), "/busy")
}

// Nothing an anonymous caller sends becomes a label: 200 made-up methods,
// 200 made-up paths and both at once, on a route and off any, add a
// handful of series (their method is "other", their route a template or
// "unmatched"), and the spans' names come from the same fixed set.
func TestObserveLabelsAreAFixedSet(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rec := tracetest.NewSpanRecorder()
	observe, err := httpapi.Observe(reg, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	require.NoError(t, err)
	e := httpapi.New(slog.New(slog.DiscardHandler), observe)
	e.GET("/things/:id", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	serve := func(method, path string) {
		rr := httptest.NewRecorder()
		e.ServeHTTP(rr, httptest.NewRequest(method, path, nil))
	}
	series := func() int {
		families, err := reg.Gather()
		require.NoError(t, err)
		n := 0
		for _, f := range families {
			n += len(f.GetMetric())
		}
		return n
	}
	// The legitimate traffic's series exist before the attack.
	serve(http.MethodGet, "/things/1")
	serve(http.MethodGet, "/nothing")
	before := series()

	for i := range 200 {
		method := fmt.Sprintf("X%dMADEUP", i)
		if i == 0 {
			method = strings.Repeat("M", 60<<10)
		}
		serve(method, fmt.Sprintf("/scan/%d/%s", i, strings.Repeat("p", i)))
		serve(method, fmt.Sprintf("/things/%d", i))
		serve(http.MethodGet, fmt.Sprintf("/made/up/%d", i))
	}
	added := series() - before
	require.LessOrEqual(t, added, 6, "series added by 600 made-up requests")

	names := map[string]bool{}
	for _, s := range rec.Ended() {
		names[s.Name()] = true
		for _, a := range s.Attributes() {
			if a.Key == "http.request.method" {
				require.Contains(t, []string{http.MethodGet, "_OTHER"}, a.Value.AsString())
			}
		}
	}
	require.Subset(t, []string{"GET /things/:id", "GET unmatched", "other /things/:id", "other unmatched"}, slices.Collect(maps.Keys(names)))
}

package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the request spans.
const tracerName = "github.com/onceflow/onceflow/internal/httpapi"

// routeUnmatched labels the requests that matched no route, so that a
// scanner's paths do not become label values.
const routeUnmatched = "unmatched"

// methodOther labels the requests whose method is none of knownMethods, so
// that made-up methods do not become label values (or span names).
const methodOther = "other"

// knownMethods are the methods that label their requests as themselves.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// methodLabel is the label of method: itself if known, else "other". The
// label set is fixed, whatever an anonymous caller sends.
func methodLabel(method string) string {
	if knownMethods[method] {
		return method
	}
	return methodOther
}

// routeLabel is the template of the route c matched (/orders/:id), or
// "unmatched": a label from a fixed set, whatever path was asked for.
func routeLabel(c echo.Context) string {
	if r := c.Path(); r != "" {
		return r
	}
	return routeUnmatched
}

// semconvMethod is method as OpenTelemetry's http.request.method wants it:
// "_OTHER" for a method it does not know.
func semconvMethod(method string) string {
	if knownMethods[method] {
		return method
	}
	return "_OTHER"
}

// untraced are the routes that get no span: probes and scrapes, which would
// drown the traces worth reading.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

var requestBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Observe returns the middleware that measures and traces every request:
// request counts by method, route and status, latency by method and route,
// requests in flight and idempotent replays, registered on reg; and a
// server span per request, a child of the request's W3C traceparent if it
// has one, from tp. Install it outermost (New does): it hands errors to the
// error handler itself, so that it sees the status that is sent, and the
// error handler logs with the span's context.
func Observe(reg prometheus.Registerer, tp trace.TracerProvider) (echo.MiddlewareFunc, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceflow_http_requests_total",
		Help: "HTTP requests served, by method, route and status code.",
	}, []string{"method", "route", "status"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "onceflow_http_request_duration_seconds",
		Help:    "Time to serve an HTTP request, by method and route.",
		Buckets: requestBuckets,
	}, []string{"method", "route"})
	inFlight := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "onceflow_http_requests_in_flight",
		Help: "HTTP requests being served.",
	})
	replays := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "onceflow_http_idempotent_replays_total",
		Help: "Requests answered with the stored response of an earlier request with the same Idempotency-Key.",
	}, []string{"method", "route"})
	var errs []error
	for _, c := range []prometheus.Collector{requests, duration, inFlight, replays} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	tracer := tp.Tracer(tracerName)

	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			inFlight.Inc()
			defer inFlight.Dec()

			req := c.Request()
			method, route := methodLabel(req.Method), routeLabel(c)
			var span trace.Span
			if !untraced[route] {
				ctx := propagation.TraceContext{}.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
				ctx, span = tracer.Start(ctx, method+" "+route,
					trace.WithSpanKind(trace.SpanKindServer),
					trace.WithAttributes(
						attribute.String("http.request.method", semconvMethod(req.Method)),
						attribute.String("http.route", route),
						attribute.String("url.path", req.URL.Path),
					))
				c.SetRequest(req.WithContext(ctx))
			}

			if err := next(c); err != nil {
				c.Error(err)
			}

			resp := c.Response()
			status := resp.Status
			requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
			duration.WithLabelValues(method, route).Observe(time.Since(start).Seconds())
			if resp.Header().Get(HeaderReplayed) == "true" {
				replays.WithLabelValues(method, route).Inc()
			}
			if span != nil {
				span.SetAttributes(attribute.Int("http.response.status_code", status))
				if status >= http.StatusInternalServerError {
					span.SetStatus(codes.Error, http.StatusText(status))
				}
				span.End()
			}
			return nil
		}
	}, nil
}

// Package telemetry holds what every part of onceflow shares to be observed:
// the W3C trace context carried from an HTTP request through the outbox and
// NATS to each consumer (TraceParent, ContextWithTraceParent, Tracer), and
// a slog handler that adds the trace id and the attributes of the context
// (event id, order id) to every record logged with a context.
//
// It depends on the OpenTelemetry API only — neither on its SDK and
// exporters (internal/app builds the tracer provider from the OTEL_*
// variables) nor on Prometheus — so that the inbox and the outbox may import
// it. Metrics are the business of the packages that run the servers
// (internal/app, internal/httpapi), each on its service's own registry.
package telemetry

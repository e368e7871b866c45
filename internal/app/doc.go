// Package app runs one onceflow service: it reads the configuration every
// service shares, migrates the service's database, waits for its JetStream
// durables (which `onceflow provision` creates), and runs the service's
// inbox consumers, its outbox relay, the partition maintenance of its inbox
// and outbox (package partition), the idempotency keys' cleaner and its
// HTTP server until the context ends — then stops in the order that loses
// nothing: stop consuming and serving, finish in-flight work, flush the
// outbox, close the connections.
//
// A service supplies only what is its own (Spec): handlers per subscription,
// HTTP routes and any extra background loop.
//
// Every service is observable the same way, with no global state: its
// Prometheus metrics (inbox outcomes, redeliveries, handler errors and
// latencies per consumer and event type; transaction latency; outbox lag,
// publish latency and delay; HTTP requests; idempotent replays; database
// pools) are on a registry of its own, served at /metrics; its spans —
// the HTTP request, each outbox write and publish, each consumer's handling —
// go to the tracer provider the OTEL_* variables describe (none by default)
// or Config.TracerProvider, and carry the W3C trace context through the
// outbox and NATS so that an order's saga is one trace; its log records
// carry the trace id and, while an event is handled, the event and order
// ids.
package app

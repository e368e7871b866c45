// Package httpapi is the HTTP edge every service shares: an echo server with
// RFC 9457 problem responses from one error handler, size-limited and
// strictly decoded JSON bodies, and the Idempotency-Key protocol on top of
// package idempotency.
//
// Handlers return errors; ErrorHandler is the one place that maps them to
// status codes, and it logs only server errors.
//
// Observe is the middleware that measures (Prometheus, on the registry it is
// given) and traces (a server span continuing the caller's traceparent)
// every request.
package httpapi

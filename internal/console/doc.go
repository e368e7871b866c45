// Package console is the operator's web console, `onceflow console` (and
// 127.0.0.1:8090 under `onceflow dev`): server-rendered pages, embedded in
// the binary, that read the services' databases and JetStream as the
// auditor does.
//
//   - /orders: the orders, newest first, searchable by id or customer and
//     by status, paginated, their statuses refreshed live;
//   - /orders/{id}: the order's saga as a picture, a lane per service and
//     an arrow per event and consumer, with the event's time and the hop's
//     latency (the event's time to the consumer's inbox row), compensations
//     and rejections marked, redrawn live while the saga runs;
//   - /pipeline: each service's unpublished outbox rows and the age of the
//     oldest, each durable's pending, unacked and redelivered messages and
//     open DLQ entries, refreshed live;
//   - /dlq: the DLQ as `onceflow dlq` lists and shows it, with replay and
//     discard, which only an operator can use (see Authorizer);
//   - /audit: the auditor's checks, run when an operator posts its form.
//
// It shows nothing to a stranger: every page but /healthz and the sign-in
// needs an operator (see Authorizer), and a browser without one is sent to
// the sign-in page, which brings it back (to a path of this site only).
// Every form post must come from the console's own pages (its Origin);
// requests for a Host the console was not configured for are refused (DNS
// rebinding); pages may not be framed and run only their own script (a
// CSP nonce); a sign-in is a session kept by the console (see sessions),
// ended at sign-out and at its TTL or its token's expiry, and the browser's
// cookie holds only its id, HttpOnly, SameSite=Strict and Secure over TLS;
// errors are logged, the browser sees only that one happened.
//
// Live views poll a fragment of their page (no script beyond a few lines
// inline); every list is a page of bounded size and every live view reads a
// bounded set of rows, so the console stays usable at 1,000 orders/s.
package console

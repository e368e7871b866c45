// Package loyalty owns … (say here what the service owns, what it
// guarantees, and how: this comment is its contract).
//
// It consumes, each subscription on a durable consumer of its own, declared
// with the saga's in streams.Saga:
//
//   - OrderConfirmed, on loyalty-orders (stream ORDERS)
//
// Each event is handled in the transaction that claims its id in the
// inbox (processed_events), so its effect happens once however often it is
// delivered. An event that cannot be decoded, or whose handler fails with
// inbox.Permanent, goes to the DLQ; any other failure is retried later.
//
// For each, it emits PointsAwarded (loyalty.points_awarded.v1, stream LOYALTY),
// written to the outbox in the same transaction and published after the
// commit.
//
// Until the service has state of its own, it keeps a starter tally of the
// events it handled per customer, served at GET /customers/{customer_id}.
//
// Scaffolded by `onceflow new service`; docs/new-service.md says why each
// file is shaped the way it is.
package loyalty

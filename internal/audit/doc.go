// Package audit checks the invariants of the order saga across the four
// service databases and the JetStream streams: the promise of onceflow,
// stated as facts that can be read back after the fact.
//
// Run waits (up to Config.Wait) until the system is quiet — every order
// terminal, every outbox empty, every consumer caught up, every e-mail sent —
// then reads each database in one read-only repeatable-read transaction and
// the consumers' and streams' state, and returns a Report with one Check per
// invariant, its figures and its violations:
//
//   - debits: each paid order has exactly one payment, debited or refunded,
//     for its total; a rejected order has a rejected payment or none; no
//     payment belongs to an unknown order.
//   - refunds: a payment is refunded if and only if inventory rejected the
//     order's stock or the order expired.
//   - money: per wallet, balance + debited (not refunded) payments = credits.
//   - stock: no stock level is negative, and stock is conserved: per SKU,
//     available + reserved = the sum of its ledger (receipts, adjustments
//     and counts, in stock_movements).
//   - reservations: what inventory reserved for an order is what the order
//     asked for.
//   - orders: every order is terminal, and its status is the one its payment
//     and reservation imply.
//   - deadlines: no order is open past its deadline plus a grace
//     (Config.ExpiryGrace, AUDIT_EXPIRY_GRACE); an expired order keeps no
//     money (its payment is EXPIRED, REJECTED or REFUNDED) and holds no
//     stock (its reservation is EXPIRED, REJECTED or RELEASED, and a
//     released reservation's units count as available again); an EXPIRED
//     payment or reservation, or a RELEASED one, belongs to an expired
//     order; every late reply in a timeline has the fate docs/saga.md gives
//     it.
//   - events: on the saga's streams, per order, no event type appears under
//     two ids (every type is once per order in the contract; a copy of an
//     event under its own id is one event), and a terminal order has
//     exactly one terminal event, the one of its status. Only what a type's
//     owner published on its subject counts; an order whose OrderPlaced
//     left the stream is not required to have its terminal event there.
//   - outbox: every outbox row of every service's database is published.
//   - consumers: every event on a stream has been processed or dead-lettered
//     by each durable that subscribes to it: the consumer has acked up to the
//     last message its filter matches, nothing is pending or unacked, and
//     every message it acked has its inbox row (processed_events) or a DLQ
//     entry — an ack without either is an effect lost. DLQ entries with
//     their reasons, and inbox rows against messages, are figures. An
//     event replayed from the DLQ (package dlq) is verified once: its
//     entry and its replay are one event.
//   - notifications: one e-mail per (order, milestone) — placed and the
//     terminal one — and none pending or failed.
//
// The databases are read one after the other, so the checks that join them
// (all but money, stock and outbox) are only exact on a quiet system: under
// load they can report an order whose next step is in flight.
//
// Per-message verification assumes what the platform guarantees: inbox rows
// outlive the stream's messages (the inbox retention exceeds the stream's max
// age). It reads every message's headers, so a stream (or DLQ) of more than a
// million messages is left to the ack floor check, and the report says so.
//
// The auditor changes no data: it runs SELECTs in read-only transactions and
// JetStream info requests, and reads the messages one by one with the
// stream's message get (internal/streamscan): it creates nothing, not even
// a consumer; the durables are only looked at.
package audit

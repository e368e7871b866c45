// Package outbox is the transactional outbox of a service database: the way
// every onceflow event leaves a service.
//
// It owns the outbox table's rows from insert to deletion:
//
//   - Enqueue writes an event on the caller's transaction, next to the state
//     change it announces, so that both commit or neither does. Nothing is
//     published inside a request.
//   - Relay publishes committed rows to JetStream with Nats-Msg-Id = event id,
//     waits for the acks, and only then marks the rows sent. It is woken by
//     LISTEN/NOTIFY and polls as well, because a notification can be lost.
//   - Cleaner deletes sent rows once they are older than the re-drive window.
//   - Redrive makes sent rows unsent again so that the relay republishes them.
//
// Guarantees:
//
//   - At-least-once publication: a row is marked sent only after JetStream
//     acknowledged it. A relay that dies between publish and mark leaves the
//     row unsent; it is published again, which the stream's duplicate window
//     drops and, past that window, the consumers' inbox absorbs.
//   - Per-aggregate order: rows are published in id order by one relay at a
//     time per database (an advisory lock), so events of one aggregate reach
//     the broker in the order they were written — provided their producer
//     writes them in that order, which it does by locking the aggregate's row
//     before enqueueing (see Enqueue). A batch stops publishing at the first
//     publish that cannot be sent, and the client never resends a publish
//     behind later ones. One limit remains: when the broker refuses a publish
//     that it received, the rows behind it are already on their way; they
//     stay unsent and are published again behind it, but the first copies
//     may be stored ahead of it.
//   - Re-drive window: a JetStream publish ack is not an fsync (the server
//     syncs to disk every two minutes by default), so an acknowledged event
//     can still be lost in a power failure. Sent rows are therefore kept for
//     CleanerConfig.Retention, at least the stream's duplicate window, during
//     which Redrive can republish them harmlessly.
package outbox

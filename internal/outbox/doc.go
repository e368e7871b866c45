// Package outbox is the transactional outbox of a service database: the way
// every onceflow event leaves a service.
//
// It owns the outbox table's rows from insert until their partition is
// dropped:
//
//   - Enqueue writes an event on the caller's transaction, next to the state
//     change it announces, so that both commit or neither does. Nothing is
//     published inside a request.
//   - Relay publishes committed rows to JetStream with Nats-Msg-Id = event id,
//     waits for the acks, and only then marks the rows sent: it inserts a
//     row per event into outbox_sent, and never updates or deletes an outbox
//     row, so that neither table has dead tuples. It is woken by
//     LISTEN/NOTIFY when it sleeps and polls as well, because a
//     notification can be lost.
//   - Both tables are partitioned by the time the outbox rows were written,
//     with the same bounds; package partition drops a partition once every
//     row in it was sent longer than the re-drive window ago, and
//     outbox_sent's partition of the same range after it (ids, and so the
//     relay's order, span the partitions).
//   - Redrive deletes the marks of the rows sent since a time, so that the
//     relay republishes them.
//   - The view outbox_unsent lists the rows not yet sent (Lag, the console,
//     the auditor).
//
// How the relay works: the relay lock is a session-level advisory lock on
// one pooled connection. Run takes it and keeps it for as long as it
// publishes (a Flush called on its own, for as long as the flush); every
// row is marked sent on that session. It works as a pipeline
// of batches: while the broker acknowledges one batch, a goroutine of the
// flush publishes the next and the database marks the one before and hands
// out the one after, so the database's work and the broker's overlap. At
// most two batches are claimed and not yet marked; a claim leaves them out
// by id. Batches are marked in the order they were claimed, each once all
// its acks are in (or up to its first failure). A mark goes to the database
// in one round trip with the next claim, so a flush ends with a claim that
// found nothing and carried the last mark.
//
// Large batches (RelayConfig.AtomicBatchMin) are published as JetStream
// atomic batches, which a server syncing every write stores with one fsync
// instead of one per message. An atomic batch is stored whole or not at
// all, and the relay waits for its ack before it publishes anything behind
// it, so a refused one has nothing behind it stored ahead of it. The broker
// refuses an atomic batch that holds a message id it has stored (what a
// relay that died before marking leaves behind, or a re-drive); the relay
// then publishes the rest of its batch a message at a time, and the broker
// drops the copies.
//
// Waking the relay: a commit that notifies takes a lock that every other
// notifying commit of the cluster waits for, so commits notify only while the
// relay sleeps. A relay that found nothing to publish takes the sleep lock,
// an advisory lock on the session that holds its relay lock, which the
// outbox trigger takes shared until its commit: the relay gets it only once
// no commit that inserted rows is in progress, claims once more to publish
// what those committed, and waits for a notification on its LISTEN session;
// while it holds the lock, the trigger cannot take it and the commit
// notifies. The lock is tried in one round trip with that claim (after a
// batch, with the claim that carries its mark), which runs either way, and
// released in one round trip with the first claim after the wake-up: a
// relay that wakes up for one batch makes two round trips. A relay that is
// busy keeps claiming while its claims find rows, and one that did not get
// the lock (commits in progress) stays awake and tries again with a claim
// within milliseconds. A standby relay does not sleep this way: it learns
// that the publishing relay is gone by polling.
//
// Finding the unsent rows without an index of them: each mark records, on
// its batch's last row, the relay's position after the claim of that batch:
// an id below which every row is sent, but for rows of transactions that had
// not finished at that claim's snapshot (its xmax and its list of running
// transaction ids; every outbox row carries its writer's transaction id,
// xact_id, indexed). A claim reads the latest position and looks at the
// rows from its id up and at the rows below it of those transactions, so
// its cost is a batch's whatever the outbox holds. The claim starts at the
// lowest unsent row so found, never after the last row claimed. A
// transaction that inserted a row with a lower id can commit after a claim
// has gone past that id; the next event of that row's aggregate is written
// only after that commit (see Enqueue), so any claim that sees the next
// event sees the late row too, and publishes it first. The query
// (db/queries/outbox ClaimUnsent) explains the rest.
//
// The relay's code, by concern: reference.go is the relay in its plain form,
// PublishOne (one row, publish, mark), to read first; relay.go holds the
// relay lock and the run loop; pipeline.go claims, settles and marks the batches; sleep.go (with
// listener.go) sleeps and wakes; publish.go publishes a batch one message at
// a time or as atomic batches. Example shows the smallest producer.
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
//     before enqueueing (see Enqueue). Publishing stops at the first publish
//     that cannot be sent, and the client never resends a publish behind
//     later ones. One limit remains: when the broker refuses a message
//     published on its own (not in an atomic batch, behind which nothing
//     goes before its ack), the rows behind it, up to the end of the next
//     batch, are already on their way; they stay unsent, acknowledged or
//     not, and are published again behind it, but the first copies may be
//     stored ahead of it.
//   - One relay publishes at a time: the lock is held while Run publishes,
//     and a relay whose connection dies loses it together with the session
//     on which it marks rows, so it can mark nothing more while another
//     relay takes over. Its publisher may still send what it had claimed;
//     the broker and the inbox absorb those copies.
//   - Shutdown: a flush whose context is canceled claims nothing more but
//     waits for the acks of the batches in flight and marks them, so that
//     what was published is also marked sent.
//   - Re-drive window: a JetStream publish ack is not an fsync (the server
//     syncs to disk every two minutes by default), so an acknowledged event
//     can still be lost in a power failure. Sent rows are therefore kept for
//     the outbox retention (OUTBOX_RETENTION; partition.OutboxTable), at
//     least the stream's duplicate window, during which Redrive can
//     republish them harmlessly.
package outbox

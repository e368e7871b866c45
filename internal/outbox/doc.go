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
//     waits for the acks, and only then records its position, one row of
//     outbox_batch per batch: no outbox row is ever updated or deleted, and
//     neither table has dead tuples. It is woken by LISTEN/NOTIFY when it
//     sleeps and polls as well, because a notification can be lost.
//   - The outbox is partitioned by the time its rows were written; package
//     partition drops a partition once every row in it was sent longer than
//     the re-drive window ago, and prunes the positions older than it.
//   - Redrive moves the relay's position back to where it was at a time, so
//     that the relay republishes what it sent since.
//   - The view outbox_unsent lists the rows not yet sent (Lag, the console,
//     the auditor, the conformance kit).
//
// # Positions and their invariants
//
// A position is PgQ's tick: a snapshot and an id. It covers an outbox row
// when the row's id is at most upto and its writer's transaction (xact_id,
// every row carries it) is visible in snap; and, while a tick holds more
// than a batch (a backlog, a big transaction that committed late), the
// rows of the span being published that are up to its cursor (span_done,
// visible in span_snap). Unsent means not covered by the relay's position,
// and that is defined once, in SQL: outbox_covered (migration 00016), which
// outbox_unsent_after filters by, and the claim, the view, the lag and the
// partition drop all read. A
// claim returns the lowest ids of the rows not covered that its snapshot
// sees, and the position that also covers them. A reviewer checks:
//
//  1. A position is recorded only after every row it covers was acked: the
//     relay records a batch's position once its acks are in, batches in
//     claim order, and stops at the first that failed (a prefix of one is
//     recorded as its claim's span up to the last row acked).
//  2. A position covers everything the positions before it covered (since
//     the latest redrive, see 5), so a record that is lost (its statement
//     failed, its claim was cancelled) loses nothing: the next covers the
//     same rows. No per-row mark exists to be lost.
//  3. No row is covered before it commits: a row not visible in a snapshot
//     has its transaction in the snapshot's running list or at or above its
//     xmax, and then no position taken from that snapshot covers it,
//     whatever its id. A row a snapshot sees has an id at most the identity
//     sequence's last value read after it, which is what a closing
//     position's upto is at least: no row that snapshot saw stays above it.
//  4. Per aggregate, publish order is write order: a producer writes an
//     aggregate's next event after the commit of its previous one (see
//     Enqueue), so a snapshot that sees the next sees the previous, whose id
//     is lower, and a batch is the lowest ids not covered.
//  5. A redrive never loses to a batch in flight: the relay's claims carry
//     the redrive they began after (epoch); positions recorded for an older
//     one are not the relay's position (outbox_position), so the rows the
//     redrive made unsent, and the batch in flight, are published again.
//  6. Positions belong to one cluster: each records the cluster's identity.
//     On a database whose position is another cluster's, or ahead of this
//     cluster's transaction ids (restored, cloned, a promoted logical
//     replica), the relay starts over from the rows (outbox_start_over:
//     every row kept is published again) and logs why.
//
// The relay's session runs READ COMMITTED whatever the database's default;
// nothing above depends on it, as each claim reads the position and the
// rows in one statement. It also commits its records without waiting for
// the WAL flush (synchronous_commit off), so that the claim riding with a
// record is not held for an fsync: a record that a crash of the database
// loses is a record lost as in 2, and nothing that read it survives the
// crash without it, since recovery replays a prefix of the WAL and a
// transaction that read the record (a partition drop, a redrive) commits
// after it.
//
// How the relay works: the relay lock is a session-level advisory lock on
// one pooled connection. Run takes it and keeps it for as long as it
// publishes (a Flush called on its own, for as long as the flush); every
// position is recorded on that session. The plain relay (the default) is
// the reference loop: claim a batch, publish it, await its acks, record its
// position with the next claim. The pipelined relay (RelayConfig.Pipelined,
// which the saga's services choose) keeps two batches in flight: while the
// broker acknowledges one batch, the database records the one before and
// hands out the one after, so the database's work and the broker's
// overlap. Both call the same claim (db/queries/outbox Claim) and record.
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
// an advisory lock (its key is the database's, outbox_sleep_lock_key) on the
// session that holds its relay lock, which the outbox trigger takes shared
// until its commit: the relay gets it only once no commit that inserted rows
// is in progress, claims once more to publish what those committed, and
// waits for a notification on its LISTEN session; while it holds the lock,
// the trigger cannot take it and the commit notifies. The lock is tried in
// one round trip with that claim (after a batch, with the claim that
// carries its record), which runs either way, and
// released in one round trip with the first claim after the wake-up: a
// relay that wakes up for one batch makes two round trips. A relay that is
// busy keeps claiming while its claims find rows, and one that did not get
// the lock (commits in progress) stays awake and tries again with a claim
// within milliseconds. A standby relay does not sleep this way: it learns
// that the publishing relay is gone by polling.
//
// The relay's code, by concern: reference.go is the relay in its plain
// form, PublishOne (one row, publish, record), to read first; relay.go holds
// the relay lock and the run loop; batches.go claims the batches, awaits
// their acks and records them; sleep.go (with listener.go) sleeps and
// wakes; publish.go publishes a batch one message at a time or as atomic
// batches. Example shows the smallest producer.
//
// Guarantees:
//
//   - At-least-once publication: a row is covered only after JetStream
//     acknowledged it. A relay that dies between publish and record leaves
//     the row unsent; it is published again, which the stream's duplicate
//     window drops and, past that window, the consumers' inbox absorbs.
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
//     on which it records, so it can record nothing more while another
//     relay takes over. Its publisher may still send what it had claimed;
//     the broker and the inbox absorb those copies.
//   - Shutdown: a flush whose context is canceled claims nothing more but
//     waits for the acks of the batches in flight and records them, so that
//     what was published is also recorded sent.
//   - Re-drive window: a JetStream publish ack is not an fsync (the server
//     syncs to disk every two minutes by default), so an acknowledged event
//     can still be lost in a power failure. Sent rows are therefore kept for
//     the outbox retention (OUTBOX_RETENTION; partition.OutboxTable), at
//     least the stream's duplicate window, during which Redrive can
//     republish them harmlessly.
package outbox

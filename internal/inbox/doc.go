// Package inbox turns JetStream's at-least-once delivery into exactly-once
// effects in PostgreSQL.
//
// It owns the processed_events table of a service database (one row per
// consumer and event) and the dispatch of a durable pull consumer's
// messages: a Consumer takes them in batches as they arrive (package
// jsbatch), records each event in processed_events in the same transaction
// as its Handler's business writes, commits, and only then acks. The table
// is partitioned by the time in the event's UUIDv7 id, so every delivery of
// an event meets its first claim in one partition; package partition drops
// whole partitions past the retention period, which is safe because a
// consumer refuses an event older than it, and the claim's transaction an
// event older than the oldest partition there is (whatever the retention
// of the replica that dropped the others).
//
// Read processOne (process.go) first: it is the pattern in one function,
// and the path every consumer runs unless it names the fast one — decode,
// claim with INSERT … ON CONFLICT DO NOTHING RETURNING (no row: a
// duplicate, acked), run the handler on the same pgx.Tx, commit, then
// settle: ack, or (settle.go) nak with a backoff or dead-letter. The batch
// path (batch.go, Config.Batched) does the same for a batch in one
// transaction, an optimisation beside it, with its speed tricks in files of
// their own (claimahead.go, writebehind.go); the examples (example_test.go)
// show the smallest consumer.
//
// Guarantees, per consumer (the durable name is the inbox's consumer key):
//
//   - A handler's writes for an event are committed at most once, however
//     often the event is delivered: the claim of the (event id, consumer)
//     key is the first statement of the transaction, and two deliveries
//     racing each other are serialised by it. A claim that fails (not a
//     conflict: an error) is never taken for a duplicate: the message is
//     retried.
//   - No message is acked unless its transaction committed. A crash before
//     the commit leaves nothing behind and the message is redelivered; a
//     crash between commit and ack leads to a redelivery that the claim
//     drops as a duplicate.
//   - A message that can never be processed — it does not decode, its
//     handler returns a permanent error or fails on the last delivery of
//     the consumer's budget, it is older than the retention period (by its
//     id's time or its own, whichever is earlier) or than the oldest
//     partition of processed_events (the claim refuses it), or further in the
//     future than that (an event from a producer whose clock is fast is
//     processed, see inTime) — is
//     copied to the DLQ stream ("dlq.<durable>", with the reason in a
//     header) and terminated. A message is terminated only after its copy
//     was stored; if the copy is refused (NATS fails, or the durable's
//     budget in the DLQ is spent) it is logged, counted
//     (OutcomeDeadLetterRefused) and the message naked, to be
//     dead-lettered again on its next delivery. A message is dead-lettered
//     once however often it is delivered: a delivery whose copy the DLQ
//     drops as a duplicate (its message id, within the DLQ's duplicate
//     window) is terminated and counted a duplicate. A body too large for
//     the DLQ is left out of the copy (HeaderDLQBodyDropped): the original
//     keeps it.
//   - One bad message never stops the consumer, and fails only itself. A
//     handler or decoder that panics has failed: its transaction rolls
//     back, the panic is logged with its stack and counted as a handler
//     error, and the message is retried, then dead-lettered with the panic
//     as its reason; the process and the batch-mates carry on.
//   - No message runs out of deliveries unrecorded (exhausted.go): the
//     server never gives up on a message (the durable's MaxDeliver is
//     unlimited, and Run refuses a durable whose is not); the inbox does,
//     on a delivery it settles. The budget (streams.MetadataMaxDeliver) is
//     how many deliveries run the handler. A delivery past it comes only
//     when none of those settled (the process died in each, or the DLQ
//     refused the copy); it runs no handler, and its claim decides: a
//     processed event is acked as a duplicate, any other dead-lettered
//     (OutcomeExhausted) — once per stored message: a second copy (its
//     term was lost) is dropped by the DLQ's dedup within the duplicate
//     window. That delivery waits for the next consumer of
//     the durable however long every replica is down, and each message
//     has its own, so a burst is no different from one message; no
//     advisory is read, so no other identity's message can make the inbox
//     dead-letter anything.
//
// With Config.Batched, a batch shares one transaction: its events are
// claimed with one statement in event id order (a batch of first
// deliveries with a plain insert sent with BEGIN ahead of the handlers'
// first statement, on the bet that they are new, claimed again with ON
// CONFLICT DO NOTHING RETURNING if one was not; a batch with a redelivery
// with ON CONFLICT at once), the handlers of the new ones run in delivery
// order, and one COMMIT ends it. When anything fails, nothing of the batch
// is committed and each message runs again on the reference path, in a
// transaction of its own. (Savepoints would cost two round trips each, on
// every batch, to save work only on the rare batch that fails.) A
// Config.BatchHandler instead receives all the new events of the batch at
// once, for set-based statements, and queues its writes for the COMMIT,
// which goes with them in one round trip. The next messages arrive while a
// batch is processed.
//
// Limits: the guarantee covers what the handler writes through its
// transaction; an external side effect needs its own outbox. A message
// whose dead letter the DLQ keeps refusing is redelivered, with a back-off
// of up to a minute, until the DLQ takes it (the log and the metric say
// so), and a decoder that kills the process outright (not a panic, which
// is recovered) is retried past the budget, since the claim needs the
// event's id.
package inbox

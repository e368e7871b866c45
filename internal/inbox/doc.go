// Package inbox turns JetStream's at-least-once delivery into exactly-once
// effects in PostgreSQL.
//
// It owns the processed_events table of a service database (one row per
// consumer and event) and the dispatch of a durable pull consumer's
// messages: a Consumer takes them in batches as they arrive (package
// jsbatch), records each event in processed_events in the same transaction
// as its Handler's business writes, commits, and only then acks. A Cleaner
// deletes the rows of events minted before the retention period, by the
// time in their UUIDv7 ids (a range of the primary key, which leads with
// the event id).
//
// Guarantees, per consumer (the durable name is the inbox's consumer key):
//
//   - A handler's writes for an event are committed at most once, however
//     often the event is delivered: the claim of the (event id, consumer)
//     key is the first statement of the transaction, and two deliveries
//     racing each other are serialised by it. It is sent with BEGIN: for a
//     redelivery, which may have been processed before, on its own round
//     trip, asking whether the event is new before the handler runs; for a
//     first delivery, as a plain insert queued ahead of the handler's first
//     statement (or with the COMMIT), in that statement's round trip. If
//     the event was processed before all the same, the insert fails, the
//     handler's statements and the COMMIT with it, and the event is a
//     duplicate.
//   - No message is acked unless its transaction committed. A crash before
//     the commit leaves nothing behind and the message is redelivered; a
//     crash between commit and ack leads to a redelivery that the claim
//     drops as a duplicate.
//   - A message that can never be processed — it does not decode, its
//     handler returns a permanent error, it was delivered MaxDeliver times,
//     or it is older than the retention period (by its id's time or its
//     own, whichever is earlier) — is copied to the DLQ stream
//     ("dlq.<durable>", with the reason in a header) and terminated. A
//     message is terminated only after its copy was stored; if the copy
//     fails, the message is redelivered instead.
//   - One bad message never stops the consumer.
//
// A handler's sqlc :exec statements are queued (postgres.WriteBehind) and
// sent ahead of its next statement that answers, or the next event's, or
// with the COMMIT; one that fails fails the event that queued it.
//
// With Config.Batched, a batch shares one transaction and one claim
// statement: for a batch of first deliveries a plain insert, on the bet that
// none of its events was processed before (cheaper than ON CONFLICT, and
// queued ahead of the handlers' first statement; a batch that loses the bet
// runs again, claimed with ON CONFLICT DO NOTHING), and for a batch with a
// redelivery ON CONFLICT DO NOTHING at once. One failure undoes only that
// event's writes and claim: the handlers run in turn right after the claim;
// when one fails, the transaction is rolled back and the batch runs again in
// a new one without the failed event. (Savepoints would cost two round trips
// each, on every batch, to save work only on the rare batch that fails.) A
// Config.BatchHandler instead receives all the new events of the batch at
// once (all its events, on the bet, in a transaction that cannot commit if
// the bet is lost), for set-based statements, and queues its writes for the
// COMMIT, which goes with them in one round trip; if it or one of its writes
// fails, the transaction is rolled back and the batch runs again with the
// Handler for each event. Its reads are planned for their arguments, its
// writes run with their generic plans. The next messages arrive while a
// batch is processed.
//
// Limits: the guarantee covers what the handler writes through its
// transaction; an external side effect needs its own outbox. A message
// whose last delivery cannot be copied to the DLQ is naked, but JetStream
// delivers it no more: the server's MAX_DELIVERIES advisory is then the
// only trace of it.
package inbox

// Package inbox turns JetStream's at-least-once delivery into exactly-once
// effects in PostgreSQL.
//
// It owns the processed_events table of a service database (one row per
// consumer and event) and the dispatch of a durable pull consumer's
// messages: a Consumer fetches them, records each event in processed_events
// in the same transaction as its Handler's business writes, commits, and only
// then acks. A Cleaner deletes the rows after the retention period.
//
// Guarantees, per consumer (the durable name is the inbox's consumer key):
//
//   - A handler's writes for an event are committed at most once, however
//     often the event is delivered: the claim of the (consumer, event id)
//     primary key is the first statement of the transaction, and two
//     deliveries racing each other are serialised by it.
//   - No message is acked unless its transaction committed. A crash before
//     the commit leaves nothing behind and the message is redelivered; a
//     crash between commit and ack leads to a redelivery that the claim
//     drops as a duplicate.
//   - A message that can never be processed — it does not decode, its
//     handler returns a permanent error, it was delivered MaxDeliver times,
//     or it is older than the retention period — is copied to the DLQ stream
//     ("dlq.<durable>", with the reason in a header) and terminated. A
//     message is terminated only after its copy was stored; if the copy
//     fails, the message is redelivered instead.
//   - One bad message never stops the consumer.
//
// With Config.Batched, a fetched batch shares one transaction and one claim
// statement, and one failure undoes only that event's writes and claim: the
// handlers run in turn under one savepoint taken after the claim; when one
// fails, the transaction rolls back to it, releases that event's claim, and
// runs the others again. (A savepoint per event would cost two more round
// trips per event.) A Config.BatchHandler instead receives all the new
// events of the batch at once, for set-based statements; if it fails, its
// writes are rolled back to the savepoint and each event runs its handler
// under a savepoint of its own.
//
// Limits: the guarantee covers what the handler writes through its
// transaction; an external side effect needs its own outbox. A message
// whose last delivery cannot be copied to the DLQ is naked, but JetStream
// delivers it no more: the server's MAX_DELIVERIES advisory is then the
// only trace of it.
package inbox

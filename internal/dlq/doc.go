// Package dlq reads the dead-letter stream and acts on its entries: it
// lists and shows them, replays an entry's event to the consumer that gave
// up on it, and discards an entry with a reason.
//
// An entry is a message of the DLQ stream, named by its sequence there. The
// inbox stored it with the original's headers and body and with its own
// (inbox.HeaderDLQ*): why it gave up, which durable, where the original is
// stored, how often it was delivered.
//
// A replay publishes the original event again, with the same CloudEvents
// headers (so the same event id and type) and body, on the replay subject
// of the durable that gave up (streams.ReplaySubject): only that durable
// receives it, and its inbox drops it as a duplicate if the event was
// processed after all. Its Nats-Msg-Id is the replay's own, so the broker's
// dedup does not drop it as the original. A replay is refused when the
// event is older than that consumer's inbox retention (read from the
// durable's metadata, see streams.MetadataInboxRetention): its
// processed_events row may be gone, and a replay could apply it twice.
//
// Every replay and discard is recorded, with who and when, on the
// DLQ_ACTIONS stream (streams.DLQActions), where the console and the
// auditor read it; an entry's status is its last action's.
package dlq

// Package dlq reads the dead-letter stream and acts on its entries: it
// lists and shows them, replays an entry's event to the consumer that gave
// up on it, and discards an entry with a reason.
//
// An entry is a message of the DLQ stream, named by its sequence there. The
// inbox stored it with the original's headers and body and with its own
// (inbox.HeaderDLQ*): why it gave up, which durable, where the original is
// stored, how often it was delivered.
//
// An entry is only what its writer says: any holder of a durable's
// credentials may write on its DLQ subject. So an entry's consumer is its
// DLQ subject's, and each entry is checked (verify.go): it is unreplayable
// when its headers disagree with that durable or the topology, or its
// original would fail the inbox's owner check (inbox.CheckOwner), and
// unverified when its original, re-read from its stream at the sequence it
// names, is gone, never was, or is another event.
//
// A replay publishes the original message, re-read from its stream, never
// the entry's copy (unless forced, for an unverified entry), with the same
// CloudEvents headers (so the same event id and type) and body, on the
// replay subject of the durable that gave up (streams.ReplaySubject): only
// that durable receives it, and its inbox drops it as a duplicate if the
// event was processed after all. It carries no Onceflow-Replay-* header
// but those of the operator's own options. Its Nats-Msg-Id is the replay's own, so the broker's
// dedup does not drop it as the original. A replay is refused when the
// event is older than that consumer's inbox retention (read from the
// durable's metadata, see streams.MetadataInboxRetention): its
// processed_events row may be gone, and a replay could apply it twice.
//
// Every replay and discard is recorded, with who and when, on the
// DLQ_ACTIONS stream (streams.DLQActions), where the console and the
// auditor read it; an entry's status is its last action's.
package dlq

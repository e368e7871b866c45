package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/streams"
)

// processOne is the inbox pattern, written plainly: the reference path,
// which processes each message when Config.Batched is off, and each
// message of a batch whose transaction failed. Read it first; the batch
// path (batch.go) does the same for many messages in one transaction.
//
//  1. Begin a transaction.
//  2. Claim the event in processed_events (INSERT … ON CONFLICT DO NOTHING
//     RETURNING). No row back: it was processed before, or by a
//     transaction the insert waited for. Nothing to do but ack.
//  3. Run the handler on the same transaction.
//  4. Commit: the claim and the handler's writes, or neither.
//  5. Only then ack (settle also naks a failure, or dead-letters it).
//
// A crash before the commit leaves nothing behind and the message comes
// again; a crash between the commit and the ack is answered by step 2.
func (c *Consumer) processOne(ctx context.Context, d *delivery) {
	defer c.settle(ctx, d) // 5. after the transaction ended, whatever happened
	start := time.Now()
	defer func() { c.cfg.Observer.Transaction(1, time.Since(start), d.err) }()

	tx, err := c.pool.Begin(ctx) // 1.
	if err != nil {
		d.fail(fmt.Errorf("begin: %w", err))
		return
	}
	defer func() { _ = tx.Rollback(ctx) }() // undoes everything, unless committed

	_, err = c.queries.ClaimEvent(ctx, tx, c.claimOf(d)) // 2.
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		d.outcome = duplicate
		return
	case err != nil: // not an answer: retried, never taken for a duplicate
		d.fail(fmt.Errorf("claim: %w", err))
		return
	}
	if err := c.handle(ctx, tx, d.ev); err != nil { // 3.
		d.fail(fmt.Errorf("handler: %w", err))
		return
	}
	// 4. A failed commit may still have happened (the connection broke
	// after the server committed); then the redelivery is a duplicate.
	if err := tx.Commit(ctx); err != nil {
		d.fail(fmt.Errorf("commit: %w", err))
		return
	}
	d.outcome = processed
}

// outcome is what became of a delivery's processing.
type outcome int

const (
	pending   outcome = iota // not processed yet
	processed                // the handler's writes and the claim are committed
	duplicate                // the event was processed before
	failed                   // nothing was committed for it; err says why
)

// delivery is one decoded message on its way through the inbox.
type delivery struct {
	msg     jetstream.Msg
	meta    *jetstream.MsgMetadata
	ev      event.Envelope
	outcome outcome
	err     error
}

func (d *delivery) fail(err error) {
	d.outcome, d.err = failed, err
}

// claimOf is the claim of d's event by the consumer.
func (c *Consumer) claimOf(d *delivery) dbsqlc.ClaimEventParams {
	return dbsqlc.ClaimEventParams{
		Consumer:  c.cfg.Durable,
		EventID:   d.ev.ID,
		EventType: string(d.ev.Type),
		EventTime: d.ev.Time,
		StreamSeq: int64(d.meta.Sequence.Stream),
	}
}

// processEach processes each message in a transaction of its own.
func (c *Consumer) processEach(ctx context.Context, msgs []jetstream.Msg) {
	for _, msg := range msgs {
		if d, ok := c.decode(ctx, msg); ok {
			c.processOne(ctx, d)
		}
	}
}

// decode reads msg's envelope and applies the retention guard. A message
// that fails either is dead-lettered here, and ok is false.
func (c *Consumer) decode(ctx context.Context, msg jetstream.Msg) (d *delivery, ok bool) {
	meta, err := msg.Metadata()
	if err != nil {
		// Only a message that did not come from a consumer lacks metadata,
		// and it could not be acked either.
		c.logger.ErrorContext(ctx, "message without JetStream metadata", "subject", msg.Subject(), "err", err)
		return nil, false
	}
	d = &delivery{msg: msg, meta: meta}
	if d.ev, err = event.FromMsg(msg.Headers(), msg.Data()); err != nil {
		c.deadLetter(ctx, d, fmt.Sprintf("decode: %v", err))
		return nil, false
	}
	if !c.fromOwner(ctx, d) {
		return nil, false
	}
	// The Cleaner deletes the processed_events row of an event minted
	// more than the retention period (and its margin) ago, so a redelivery
	// of it would not be recognised: it is dead-lettered instead. An event whose own time
	// is that old is too, whatever its id says, so that an event that
	// claims to be ancient is never processed blindly.
	born := d.ev.Time
	if minted := d.ev.Minted(); minted.Before(born) {
		born = minted
	}
	if age := time.Since(born); age > c.cfg.Retention && !c.replayPastRetention(msg) {
		c.deadLetter(ctx, d, fmt.Sprintf("event %s is %s old, beyond the inbox retention of %s: it may have been processed already",
			d.ev.ID, age.Round(time.Second), c.cfg.Retention))
		return nil, false
	}
	return d, true
}

// HeaderReplayPastRetention is "true" on a replay from the DLQ that an
// operator forced past the consumer's retention (onceflow dlq replay
// --past-retention): the retention guard lets it through.
const HeaderReplayPastRetention = "Onceflow-Replay-Past-Retention"

// replayPastRetention reports whether msg is an operator's replay to this
// consumer that overrides the retention guard: it carries the header and
// came on the consumer's own replay subject, which only the operator's
// identity may publish.
func (c *Consumer) replayPastRetention(msg jetstream.Msg) bool {
	if msg.Headers().Get(HeaderReplayPastRetention) != "true" {
		return false
	}
	_, durable, ok := streams.ReplayOf(msg.Subject())
	return ok && durable == c.cfg.Durable
}

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
)

// processOne is the inbox pattern, the life of one message in one function:
// the reference path. It processes every message of a consumer that did not
// opt into Config.Batched, and each message of a batch whose transaction
// failed. Read it first; the batch path (batch.go) does the same for many
// messages in one transaction, and settles them with the same ack and fail.
//
// A crash before the commit leaves nothing behind and the message comes
// again; a crash between the commit and the ack is answered by step 2. A
// handler that panics has failed, like one that returned an error. A
// delivery past the consumer's budget runs no handler: those before it
// never settled, and the claim only tells whether one of them committed.
func (c *Consumer) processOne(ctx context.Context, msg jetstream.Msg) Outcome {
	d, err := c.decode(ctx, msg) // 1. Decode; check its owner and age.
	if err != nil {
		return c.fail(ctx, d, err)
	}
	start := time.Now()
	tx, err := c.begin(ctx, d)
	if err != nil {
		return c.fail(ctx, d, c.rollback(ctx, nil, start, fmt.Errorf("begin: %w", err)))
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once it ended; a safety net if the inbox panics
	// 2. Claim: INSERT … ON CONFLICT DO NOTHING RETURNING. An event older
	// than the oldest partition is refused, as a permanent failure.
	_, err = c.queries.ClaimEvent(ctx, tx, c.claimOf(d))
	if errors.Is(err, pgx.ErrNoRows) { // no row: processed before (or by the transaction it waited for)
		_ = c.rollback(ctx, tx, start, nil)
		return c.ack(ctx, d, OutcomeDuplicate)
	}
	if err != nil { // not an answer: retried, never taken for a duplicate
		return c.fail(ctx, d, c.rollback(ctx, tx, start, fmt.Errorf("claim: %w", err)))
	}
	if c.spent(d) { // past its budget (exhausted.go): unprocessed, so dead-lettered, never handled
		_ = c.rollback(ctx, tx, start, nil)
		return c.exhausted(ctx, d)
	}
	if err := c.handle(ctx, tx, d.ev); err != nil { // 3. Handle, on the same tx; a panic is an error.
		return c.fail(ctx, d, c.rollback(ctx, tx, start, fmt.Errorf("handler: %w", err)))
	}
	// 4. Commit the claim and the writes, or neither. (A commit that failed
	// may have happened: then the redelivery is a duplicate.)
	err = tx.Commit(ctx)
	c.cfg.Observer.Transaction(1, time.Since(start), err)
	if err != nil {
		return c.fail(ctx, d, fmt.Errorf("commit: %w", err))
	}
	return c.ack(ctx, d, OutcomeProcessed) // 5. Settle: only now ack. (fail naks, or dead-letters.)
}

// begin begins d's transaction. An operator's replay forced past the
// retention (decode.go) says so in it: its claim may go below the oldest
// partition of processed_events, which a claim is refused otherwise.
func (c *Consumer) begin(ctx context.Context, d *delivery) (pgx.Tx, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil || !d.pastRetention {
		return tx, err
	}
	if err := c.queries.ClaimPastRetention(ctx, tx); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("claim past the retention: %w", err)
	}
	return tx, nil
}

// rollback rolls tx back (if it began), tells the Observer how the
// transaction ended, and returns err, why it ended.
func (c *Consumer) rollback(ctx context.Context, tx pgx.Tx, start time.Time, err error) error {
	if tx != nil {
		_ = tx.Rollback(ctx) // a broken connection rolls back by itself
	}
	c.cfg.Observer.Transaction(1, time.Since(start), err)
	return err
}

// delivery is one decoded message on its way through the inbox.
type delivery struct {
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata // nil only for a message that no consumer delivered
	ev   event.Envelope         // zero until decoded
	// pastRetention: an operator's replay forced past the retention
	// (replayPastRetention), which its claim's transaction says.
	pastRetention bool
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
		c.processOne(ctx, msg)
	}
}

package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// This file is the fast path, read after processOne: the same steps for a
// whole batch in one transaction (Config.Batched). It claims every event
// of the batch with one statement; runs the handlers of the new ones, or
// the set-based BatchHandler once for all of them; and commits once, with
// the set-based handler's queued writes. When anything fails, nothing of
// the batch is committed and each message is processed again on the
// reference path, in a transaction of its own: a failure then fails only
// its own event, and no transaction of the fallback holds the locks of more
// than one event, so it cannot deadlock with a batch that locks the same
// rows in another order. Failures are rare; the fallback costs a batch of
// transactions when one happens.
//
// The claim costs no round trip of its own. A batch of first deliveries is
// claimed ahead (claimAhead): a plain insert of every event, which needs no
// answer, sent with BEGIN in the round trip of the handlers' first
// statement, on the bet that none was processed before. The bet is lost
// only by an event published again past the broker's duplicate window; the
// insert then fails, and the transaction with it, and the batch is claimed
// again asking which events are new (claimBatch, ON CONFLICT DO NOTHING
// RETURNING, sent with BEGIN), as a batch with a redelivery is at once.

// processBatch processes msgs in one transaction and settles each, or falls
// back to processOne for each message when the transaction fails.
func (c *Consumer) processBatch(ctx context.Context, msgs []jetstream.Msg) {
	ds := make([]*delivery, 0, len(msgs))
	for _, msg := range msgs {
		if d, ok := c.decode(ctx, msg); ok {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return
	}
	ahead := !slices.ContainsFunc(ds, func(d *delivery) bool { return d.meta.NumDelivered > 1 })
	err := c.commitBatch(ctx, ds, ahead)
	if errors.Is(err, errProcessedBefore) {
		err = c.commitBatch(ctx, ds, false)
	}
	switch {
	case err == nil:
		for _, d := range ds {
			c.settle(ctx, d)
		}
	case len(ds) == 1 && c.cfg.BatchHandler == nil:
		// Its failure is its own: the reference path would only repeat it.
		ds[0].fail(err)
		c.settle(ctx, ds[0])
	default:
		c.logger.DebugContext(ctx, "batch failed; processing its messages one by one", "messages", len(ds), "err", err)
		for _, d := range ds {
			d.outcome, d.err = pending, nil
			c.processOne(ctx, d)
		}
	}
}

// errProcessedBefore is the failure of a batch claimed ahead when one of
// its events was processed before.
var errProcessedBefore = errors.New("an event of the batch was processed before")

// commitBatch claims, handles and commits ds in one transaction, and
// records each delivery's outcome; with ahead, it claims them ahead (see
// claimAhead). If it fails, nothing is committed and no outcome is
// recorded.
func (c *Consumer) commitBatch(ctx context.Context, ds []*delivery, ahead bool) (err error) {
	start := time.Now()
	defer func() { c.cfg.Observer.Transaction(len(ds), time.Since(start), err) }()
	begin := postgres.BeginWith(c.pool) // BEGIN goes with the claim
	defer begin.End(ctx)                // rolls back unless committed

	var claim *batchClaim
	if ahead {
		claim = c.claimAhead(ctx, begin, ds)
	} else if claim, err = c.claimBatch(ctx, begin, ds); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	writes, err := c.handleNew(ctx, begin.Tx(), claim.fresh)
	if err == nil {
		err = begin.Commit(ctx, writes)
	}
	if err != nil {
		if postgres.IsUniqueViolation(claim.aheadErr) {
			return errProcessedBefore
		}
		return err
	}
	claim.settled()
	return nil
}

// batchClaim is what the claim of a batch found.
type batchClaim struct {
	fresh      []*delivery // new events, in delivery order: to handle
	duplicates []*delivery // processed before, or a copy of an event earlier in the batch
	aheadErr   error       // the failure of a claim sent ahead, once sent
}

// settled records the outcomes once the batch committed.
func (b *batchClaim) settled() {
	for _, d := range b.fresh {
		d.outcome = processed
	}
	for _, d := range b.duplicates {
		d.outcome = duplicate
	}
}

// claimArgs is the claim of ds's events, in event id order (the queries
// sort too), so that two batches that overlap after a redelivery lock
// their keys in the same order and cannot deadlock.
func (c *Consumer) claimArgs(ds []*delivery) dbsqlc.ClaimEventsParams {
	byID := slices.SortedFunc(slices.Values(ds), func(a, b *delivery) int {
		return bytes.Compare(a.ev.ID[:], b.ev.ID[:])
	})
	arg := dbsqlc.ClaimEventsParams{Consumer: c.cfg.Durable}
	for _, d := range byID {
		arg.EventIds = append(arg.EventIds, d.ev.ID)
		arg.EventTypes = append(arg.EventTypes, string(d.ev.Type))
		arg.EventTimes = append(arg.EventTimes, d.ev.Time)
		arg.StreamSeqs = append(arg.StreamSeqs, int64(d.meta.Sequence.Stream))
	}
	return arg
}

// claimAhead queues the claim of every event of ds on begin's Ahead, to go
// with BEGIN in the round trip of the handlers' first statement (or of the
// COMMIT), and returns them all as fresh, but for the copies of an event
// earlier in the batch. If one of them was processed before, the claim
// fails with a unique violation, which the returned claim's aheadErr holds
// once it was sent, and so does the statement that carried it.
func (c *Consumer) claimAhead(ctx context.Context, begin *postgres.TxStart, ds []*delivery) *batchClaim {
	b := split(ds, func(uuid.UUID) bool { return true })
	c.planReads(ctx, begin)
	begin.Ahead().AfterSend(func(err error) { b.aheadErr = err })
	_ = c.queries.ClaimNewEvents(ctx, begin.Ahead(), dbsqlc.ClaimNewEventsParams(c.claimArgs(b.fresh))) // queued
	return b
}

// claimBatch claims the events of ds with one statement that answers which
// are new, sent with BEGIN in one round trip.
func (c *Consumer) claimBatch(ctx context.Context, begin *postgres.TxStart, ds []*delivery) (*batchClaim, error) {
	c.planReads(ctx, begin)
	claimed, err := c.queries.ClaimEvents(ctx, begin, c.claimArgs(ds))
	if err != nil {
		return nil, err
	}
	isNew := make(map[uuid.UUID]bool, len(claimed))
	for _, id := range claimed {
		isNew[id] = true
	}
	return split(ds, func(id uuid.UUID) bool { return isNew[id] }), nil
}

// split returns ds as a claim: the first copy of each event that claimed
// says is new is fresh, every other delivery a duplicate.
func split(ds []*delivery, claimed func(uuid.UUID) bool) *batchClaim {
	b := &batchClaim{}
	seen := make(map[uuid.UUID]bool, len(ds))
	for _, d := range ds {
		if seen[d.ev.ID] || !claimed(d.ev.ID) {
			b.duplicates = append(b.duplicates, d)
		} else {
			b.fresh = append(b.fresh, d)
		}
		seen[d.ev.ID] = true
	}
	return b
}

// planReads queues, for a set-based batch, the setting that plans its
// reads for their arguments: a batch's arrays would defeat a generic plan.
func (c *Consumer) planReads(ctx context.Context, begin *postgres.TxStart) {
	if c.cfg.BatchHandler != nil {
		_ = c.queries.PlanEachCall(ctx, begin.Ahead()) // queued: its error is the claim's
	}
}

// handleNew runs the handlers for the new events of the batch, in delivery
// order, or the BatchHandler once for all of them. It returns the set-based
// handler's writes, to be sent with the COMMIT.
func (c *Consumer) handleNew(ctx context.Context, tx pgx.Tx, fresh []*delivery) (*postgres.Pipeline, error) {
	if len(fresh) == 0 {
		return nil, nil
	}
	if c.cfg.BatchHandler == nil {
		for _, d := range fresh {
			if err := c.handle(ctx, tx, d.ev); err != nil {
				return nil, fmt.Errorf("handler of event %s: %w", d.ev.ID, err)
			}
		}
		return nil, nil
	}
	evs := make([]event.Envelope, len(fresh))
	for i, d := range fresh {
		evs[i] = d.ev
	}
	// The writes run with their generic plans, made once per connection.
	writes := &postgres.Pipeline{}
	_ = c.queries.PlanGeneric(ctx, writes) // queued
	if err := c.handleBatch(ctx, tx, evs, writes); err != nil {
		return nil, fmt.Errorf("batch handler: %w", err)
	}
	return writes, nil
}

package inbox

import (
	"bytes"
	"context"
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
// of the batch with one statement, sent with BEGIN; runs the handlers of
// the new ones, or the set-based BatchHandler once for all of them; and
// commits once, with the set-based handler's queued writes. When anything
// fails, nothing of the batch is committed and each message is processed
// again on the reference path, in a transaction of its own: a failure then
// fails only its own event, and no transaction of the fallback holds the
// locks of more than one event, so it cannot deadlock with a batch that
// locks the same rows in another order. Failures are rare; the fallback
// costs a batch of transactions when one happens.

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
	err := c.commitBatch(ctx, ds)
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

// commitBatch claims, handles and commits ds in one transaction, and
// records each delivery's outcome. If it fails, nothing is committed and
// no outcome is recorded.
func (c *Consumer) commitBatch(ctx context.Context, ds []*delivery) (err error) {
	start := time.Now()
	defer func() { c.cfg.Observer.Transaction(len(ds), time.Since(start), err) }()
	begin := postgres.BeginWith(c.pool) // BEGIN goes with the claim
	defer begin.End(ctx)                // rolls back unless committed

	claim, err := c.claimBatch(ctx, begin, ds)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	writes, err := c.handleNew(ctx, begin.Tx(), claim.fresh)
	if err != nil {
		return err
	}
	if err := begin.Commit(ctx, writes); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	claim.settled()
	return nil
}

// batchClaim is what the claim of a batch found.
type batchClaim struct {
	fresh      []*delivery // new events, in delivery order: to handle
	duplicates []*delivery // processed before, or a copy of an event earlier in the batch
}

// settled records the outcomes once the batch committed.
func (b batchClaim) settled() {
	for _, d := range b.fresh {
		d.outcome = processed
	}
	for _, d := range b.duplicates {
		d.outcome = duplicate
	}
}

// claimBatch claims the events of ds with one statement, in event id order
// (the query sorts too), so that two batches that overlap after a
// redelivery lock their keys in the same order and cannot deadlock. It is
// sent with BEGIN in one round trip; for a set-based batch, so is the
// setting that plans its reads for their arguments (PlanEachCall).
func (c *Consumer) claimBatch(ctx context.Context, begin *postgres.TxStart, ds []*delivery) (batchClaim, error) {
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
	if c.cfg.BatchHandler != nil {
		// A batch's arrays would defeat a generic plan of its reads.
		_ = c.queries.PlanEachCall(ctx, begin.Ahead()) // queued: its error is the claim's
	}
	claimed, err := c.queries.ClaimEvents(ctx, begin, arg)
	if err != nil {
		return batchClaim{}, err
	}
	isNew := make(map[uuid.UUID]bool, len(claimed))
	for _, id := range claimed {
		isNew[id] = true
	}
	var b batchClaim
	for _, d := range ds {
		if isNew[d.ev.ID] {
			isNew[d.ev.ID] = false // a second copy in the batch is a duplicate
			b.fresh = append(b.fresh, d)
		} else {
			b.duplicates = append(b.duplicates, d)
		}
	}
	return b, nil
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

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

	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// This file is the fast path a subscription opts into with Config.Batched,
// read after processOne: the same steps for a whole batch in one
// transaction. It claims every event of the batch with one statement; runs
// the handlers of the new ones in delivery order, or the set-based
// BatchHandler once for all of them (writebehind.go); and commits once.
// When anything fails, nothing of the batch is committed and each message
// is processed again by processOne, in a transaction of its own: a failure
// (an error or a panic) then fails only its own event, and no transaction
// of the fallback holds the locks of more than one event, so it cannot
// deadlock with a batch that locks the same rows in another order.
// Failures are rare; the fallback costs a batch of transactions when one
// happens. A batch of first deliveries saves the claim's round trip by
// claiming ahead (claimahead.go).

// processBatch processes msgs in one transaction and settles each, or falls
// back to processOne for each message when the transaction fails.
func (c *Consumer) processBatch(ctx context.Context, msgs []jetstream.Msg) {
	ds := make([]*delivery, 0, len(msgs))
	for _, msg := range msgs {
		d, err := c.decode(ctx, msg)
		switch {
		case err != nil:
			c.fail(ctx, d, err)
		case c.spent(d):
			c.processOne(ctx, msg) // past its budget: dead-lettered unless processed (exhausted.go)
		case d.pastRetention:
			c.processOne(ctx, msg) // an operator's override, which its claim's transaction says
		default:
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return
	}
	ahead := !slices.ContainsFunc(ds, func(d *delivery) bool { return d.meta.NumDelivered > 1 })
	claim, err := c.commitBatch(ctx, ds, ahead)
	if errors.Is(err, errProcessedBefore) {
		claim, err = c.commitBatch(ctx, ds, false)
	}
	switch {
	case err == nil:
		for _, d := range claim.fresh {
			c.ack(ctx, d, OutcomeProcessed)
		}
		for _, d := range claim.duplicates {
			c.ack(ctx, d, OutcomeDuplicate)
		}
	case len(ds) == 1 && c.cfg.BatchHandler == nil:
		// Its failure is its own: the reference path would only repeat it.
		c.fail(ctx, ds[0], err)
	default:
		c.logger.DebugContext(ctx, "batch failed; processing its messages one by one", "messages", len(ds), "err", err)
		for _, d := range ds {
			c.processOne(ctx, d.msg)
		}
	}
}

// commitBatch claims, handles and commits ds in one transaction, and
// returns what the claim found; with ahead, it claims them ahead (see
// claimAhead). If it fails, nothing is committed.
func (c *Consumer) commitBatch(ctx context.Context, ds []*delivery, ahead bool) (*batchClaim, error) {
	start := time.Now()
	claim, err := c.transactBatch(ctx, ds, ahead)
	c.cfg.Observer.Transaction(len(ds), time.Since(start), err)
	return claim, err
}

func (c *Consumer) transactBatch(ctx context.Context, ds []*delivery, ahead bool) (*batchClaim, error) {
	begin := postgres.BeginWith(c.pool) // BEGIN goes with the claim
	defer begin.End(ctx)                // rolls back unless committed

	var claim *batchClaim
	if ahead {
		claim = c.claimAhead(ctx, begin, ds)
	} else {
		var err error
		if claim, err = c.claimBatch(ctx, begin, ds); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
	}
	writes, err := c.handleNew(ctx, begin.Tx(), claim.fresh)
	if err == nil {
		err = begin.Commit(ctx, writes)
	}
	if err != nil {
		if postgres.IsUniqueViolation(claim.aheadErr) {
			return nil, errProcessedBefore
		}
		return nil, err
	}
	return claim, nil
}

// batchClaim is what the claim of a batch found.
type batchClaim struct {
	fresh      []*delivery // new events, in delivery order: to handle
	duplicates []*delivery // processed before, or a copy of an event earlier in the batch
	aheadErr   error       // the failure of a claim sent ahead, once sent
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

// claimBatch claims the events of ds with one statement that answers which
// are new (ON CONFLICT DO NOTHING RETURNING), sent with BEGIN in one round
// trip.
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

// handleNew runs the handlers for the new events of the batch, in delivery
// order, or the BatchHandler once for all of them. It returns the set-based
// handler's writes, to be sent with the COMMIT.
func (c *Consumer) handleNew(ctx context.Context, tx pgx.Tx, fresh []*delivery) (*postgres.Pipeline, error) {
	switch {
	case len(fresh) == 0:
		return nil, nil
	case c.cfg.BatchHandler != nil:
		return c.handleSetBased(ctx, tx, fresh)
	}
	for _, d := range fresh {
		if err := c.handle(ctx, tx, d.ev); err != nil {
			return nil, fmt.Errorf("handler of event %s: %w", d.ev.ID, err)
		}
	}
	return nil, nil
}

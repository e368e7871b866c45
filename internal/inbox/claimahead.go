package inbox

import (
	"context"
	"errors"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// Claiming ahead, a speed trick of the batch path (batch.go): a batch of
// first deliveries is claimed with a plain insert of every event, which
// needs no answer, sent with BEGIN in the round trip of the handlers' first
// statement, on the bet that none was processed before. The bet is lost
// only by an event published again past the broker's duplicate window; the
// insert then fails, and the transaction with it, and the batch is claimed
// again asking which events are new (claimBatch), as a batch with a
// redelivery is at once.

// errProcessedBefore is the failure of a batch claimed ahead when one of
// its events was processed before.
var errProcessedBefore = errors.New("an event of the batch was processed before")

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

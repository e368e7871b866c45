package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
)

// Writing behind, the last speed trick of the batch path (batch.go): a
// subscription's set-based BatchHandler receives all the new events of a
// batch at once and queues the writes that need no answer on an explicit
// pipeline, which goes to the database with the COMMIT in one round trip.

// handleSetBased runs the BatchHandler once for the new events of the
// batch, and returns the writes it queued.
func (c *Consumer) handleSetBased(ctx context.Context, tx pgx.Tx, fresh []*delivery) (*postgres.Pipeline, error) {
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

// planReads queues, for a set-based batch, the setting that plans its
// reads for their arguments: a batch's arrays would defeat a generic plan.
func (c *Consumer) planReads(ctx context.Context, begin *postgres.TxStart) {
	if c.cfg.BatchHandler != nil {
		_ = c.queries.PlanEachCall(ctx, begin.Ahead()) // queued: its error is the claim's
	}
}

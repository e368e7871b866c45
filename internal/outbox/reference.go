package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
)

// PublishOne is the relay's reference loop, the plain form of what a Relay
// does a batch at a time (batches.go): under the relay lock, claim
// the oldest unsent row, publish it with its event id as the message id,
// wait for the broker's ack, and only then record the position that covers
// it. A crash between the ack and the record publishes the row again, which
// the stream's duplicate window drops and the consumers' inbox absorbs. It
// reports whether it published a row: false when none was unsent, or
// another relay holds the lock. Example_referenceRelay calls it in a loop;
// a service runs a Relay, which does the same for a batch at a time, woken
// by commits.
func PublishOne(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire outbox connection: %w", err)
	}
	defer conn.Release()
	q := dbsqlc.New()
	// 1. One relay at a time, so that an aggregate's events go in order.
	l, err := q.TryRelayLock(ctx, conn, DefaultLockKey)
	if err != nil || !l.Locked {
		return false, err
	}
	defer func() { _ = q.ReleaseRelayLocks(context.WithoutCancel(ctx), conn) }()
	if l.Changed != "" {
		return false, fmt.Errorf("outbox relay position: %s: a Relay starts over", l.Changed)
	}
	// 2. The oldest unsent row, from the recorded position.
	rows, err := q.Claim(ctx, conn, dbsqlc.ClaimParams{Snap: nothingCovered, SpanSnap: nothingCovered, Epoch: recordedPosition, BatchSize: 1})
	if err != nil || len(rows) == 0 {
		return false, err
	}
	row := rows[0]
	msg, err := message(row)
	if err != nil {
		return false, err
	}
	// 3. Publish, and wait for the ack: stored (or a duplicate the broker dropped).
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return false, fmt.Errorf("publish outbox row %d: %w", row.ID, err)
	}
	// 4. Only then record the position after the claim, which covers it.
	if err := q.RecordBatch(ctx, conn, after(rows, 1, l.SystemID).record()); err != nil {
		return false, fmt.Errorf("record outbox row %d sent: %w", row.ID, err)
	}
	return true, nil
}

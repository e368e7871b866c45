package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
)

// PublishOne is the relay's reference loop, the plain form of what a Relay
// does in a pipeline of batches (pipeline.go): under the relay lock, take
// the oldest unsent row, publish it with its event id as the message id,
// wait for the broker's ack, and only then mark it sent. A crash between
// the ack and the mark publishes the row again, which the stream's
// duplicate window drops and the consumers' inbox absorbs. It reports
// whether it published a row: false when none was unsent, or another relay
// holds the lock. Example_referenceRelay calls it in a loop; a service runs
// a Relay, which does the same for a batch at a time, woken by commits.
func PublishOne(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire outbox connection: %w", err)
	}
	defer conn.Release()
	q := dbsqlc.New()
	// 1. One relay at a time, so that an aggregate's events go in order.
	if locked, err := q.TryRelayLock(ctx, conn, DefaultLockKey); err != nil || !locked {
		return false, err
	}
	defer func() { _ = q.ReleaseRelayLocks(context.WithoutCancel(ctx), conn) }()
	// 2. The oldest unsent row.
	rows, err := q.ClaimUnsent(ctx, conn, dbsqlc.ClaimUnsentParams{BatchSize: 1})
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
	// 4. Only then mark it sent, with the position the claim found, from
	// which the next claim looks for unsent rows.
	if err := q.MarkSent(ctx, conn, markOf(rows, 1)); err != nil {
		return false, fmt.Errorf("mark outbox row %d sent: %w", row.ID, err)
	}
	return true, nil
}

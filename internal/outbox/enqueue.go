package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
)

// Enqueue writes ev to the outbox on the caller's transaction tx; it never
// opens a transaction of its own. The event is published after tx commits,
// and not at all if tx rolls back.
//
// Events are published in outbox id order, which is insert order. Events of
// one aggregate therefore reach the broker in the order they were written
// only if no two transactions write events of that aggregate concurrently: a
// producer enqueues after locking its aggregate's row (e.g. SELECT … FOR
// UPDATE on the order), so that the later transaction inserts after the
// earlier one committed.
//
// An invalid envelope is refused with an error wrapping event.ErrInvalid.
func Enqueue(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	// The data column is jsonb, which would refuse it at insert time with a
	// less useful error.
	if !json.Valid(ev.Data) {
		return fmt.Errorf("enqueue: %w: %s: data is not JSON", event.ErrInvalid, ev.ID)
	}
	subject, err := ev.Type.NATSSubject()
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	err = dbsqlc.New().InsertEvent(ctx, tx, dbsqlc.InsertEventParams{
		EventID:     ev.ID,
		EventType:   string(ev.Type),
		Source:      ev.Source,
		Subject:     ev.Subject,
		NatsSubject: subject,
		EventTime:   ev.Time,
		Data:        ev.Data,
		Traceparent: ev.TraceParent,
	})
	if err != nil {
		return fmt.Errorf("enqueue %s %s: %w", ev.Type, ev.ID, err)
	}
	return nil
}

// Redrive marks every row sent at or after since as unsent again, so that the
// relay publishes those events once more, and returns how many rows it marked.
// It is the answer to a broker that lost acknowledged messages (an ack is not
// an fsync). Republishing is harmless: the stream's duplicate window drops
// what it still remembers, and the consumers' inbox absorbs the rest. Rows
// already deleted by the Cleaner are out of reach.
func Redrive(ctx context.Context, pool *pgxpool.Pool, since time.Time) (int64, error) {
	n, err := dbsqlc.New().Redrive(ctx, pool, since)
	if err != nil {
		return 0, fmt.Errorf("redrive outbox since %s: %w", since.Format(time.RFC3339), err)
	}
	return n, nil
}

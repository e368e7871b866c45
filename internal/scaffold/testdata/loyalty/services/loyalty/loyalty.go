package loyalty

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/services/loyalty/internal/dbsqlc"
)

// Service is the loyalty service's behaviour: its event handlers and HTTP API.
type Service struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
}

// New returns the service on its database.
func New(pool *pgxpool.Pool) *Service {
	return &Service{pool: pool, queries: dbsqlc.New()}
}

// HandleOrderConfirmed applies OrderConfirmed events. It runs inside the inbox's
// transaction, after the event's id was claimed: it writes through tx only
// (a plain pgx.Tx: each statement's error comes back where it is called),
// and an error rolls its writes back with the claim — wrapped in
// inbox.Permanent when no retry can succeed (the event goes to the DLQ),
// else the event is retried later.
func (s *Service) HandleOrderConfirmed(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderConfirmed {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderConfirmedV1
	if err := ev.Decode(&p); err != nil {
		return err // invalid: wraps event.ErrInvalid, so it goes to the DLQ
	}
	// The starter effect, to be replaced by the service's own writes: count
	// the event for its customer.
	if err := s.queries.CountEvent(ctx, tx, dbsqlc.CountEventParams{CustomerID: p.CustomerID, EventID: ev.ID}); err != nil {
		return fmt.Errorf("count %s of customer %s: %w", ev.Type, p.CustomerID, err)
	}
	// The event out, written on tx too: published after the commit, or not
	// at all. Caused keeps the order as its subject and continues the trace.
	next, err := ev.Caused(Name, event.PointsAwarded, event.PointsAwardedV1{Order: p.Order})
	if err != nil {
		return err
	}
	return outbox.Enqueue(ctx, tx, next)
}

package notify

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/notify/internal/dbsqlc"
)

// HandleOrderMilestoneBatch is the set-based form of HandleOrderMilestone
// for the new events of an inbox batch: it builds every event's e-mail as
// HandleOrderMilestone does and queues one statement that inserts them all
// (it goes with the inbox's COMMIT), in delivery order, so that the
// database ends up as HandleOrderMilestone called for each event in turn
// would leave it — the same rows, the same ids, and of two events of the
// batch with the same (order, milestone) the first one's row.
//
// An event it cannot decode, or of another type, fails the whole batch: the
// inbox then falls back to HandleOrderMilestone per event, which
// dead-letters that one alone.
//
// The rows are inserted in delivery order rather than key order, to keep the
// ids (the sending and listing order) those of per-event processing. Two
// concurrent batches can then wait for each other's keys only if both carry
// the same milestones re-emitted under new event ids, in opposite orders,
// as per-event processing would; the deadlock is retried by the inbox.
func (s *Service) HandleOrderMilestoneBatch(ctx context.Context, _ pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	if len(evs) == 0 {
		return nil
	}
	arg := dbsqlc.InsertNotificationsParams{
		OrderIds:    make([]uuid.UUID, len(evs)),
		CustomerIds: make([]string, len(evs)),
		Kinds:       make([]string, len(evs)),
		Recipients:  make([]string, len(evs)),
		EventIds:    make([]uuid.UUID, len(evs)),
		MessageIds:  make([]string, len(evs)),
		Subjects:    make([]string, len(evs)),
		Bodies:      make([]string, len(evs)),
		Statuses:    make([]string, len(evs)),
		LastErrors:  make([]string, len(evs)),
	}
	for i, ev := range evs {
		n, err := notification(ev)
		if err != nil {
			return fmt.Errorf("event %s: %w", ev.ID, err)
		}
		arg.OrderIds[i], arg.CustomerIds[i], arg.Kinds[i], arg.Recipients[i] = n.OrderID, n.CustomerID, n.Kind, n.Recipient
		arg.EventIds[i], arg.MessageIds[i] = n.EventID, n.MessageID
		arg.Subjects[i], arg.Bodies[i] = n.Subject, n.Body
		arg.Statuses[i], arg.LastErrors[i] = n.Status, n.LastError
	}
	if _, err := s.queries.InsertNotifications(ctx, writes, arg); err != nil {
		return fmt.Errorf("write %d notifications: %w", len(evs), err)
	}
	return nil
}

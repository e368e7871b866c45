package inventory

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/inventory/internal/dbsqlc"
)

// Reservation statuses an expired order leads to.
const (
	// StatusReleased is a reservation given back because its order
	// expired; its lines stay, as the record of what it held.
	StatusReleased = "RELEASED"
	// StatusExpired is an order that expired before inventory decided: a
	// PaymentDebited that comes later reserves nothing.
	StatusExpired = "EXPIRED"
)

// HandleOrderExpired undoes what inventory did for an order that expired:
// its reservation is released, once (only a RESERVED one is, and it becomes
// RELEASED in the same transaction). An order not yet decided gets an
// EXPIRED decision, so that its PaymentDebited, when it comes after,
// reserves nothing: the OrderExpired may overtake it, on a durable of its
// own. A rejection held nothing and stays as it is.
func (s *Service) HandleOrderExpired(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	orderID, err := expiredOrder(ev)
	if err != nil {
		return err
	}
	r, err := s.queries.LockReservation(ctx, tx, orderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		n, err := s.queries.InsertReservation(ctx, tx, dbsqlc.InsertReservationParams{OrderID: orderID, Status: StatusExpired})
		if err != nil {
			return fmt.Errorf("record expiry of order %s: %w", orderID, err)
		}
		if n == 0 {
			// A PaymentDebited decided in the meantime: retried, this
			// event finds its decision and undoes it.
			return fmt.Errorf("order %s was decided while it expired", orderID)
		}
		return nil
	case err != nil:
		return fmt.Errorf("lock reservation of order %s: %w", orderID, err)
	case r.Status != StatusReserved:
		return nil
	}
	return s.release(ctx, tx, orderID)
}

// release gives the stock of the locked, RESERVED reservation of orderID
// back and marks it RELEASED.
func (s *Service) release(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) error {
	lines, err := s.queries.ReservationLines(ctx, tx, orderID)
	if err != nil {
		return fmt.Errorf("read reservation of order %s: %w", orderID, err)
	}
	arg := dbsqlc.IncrementStockParams{}
	for _, l := range lines {
		arg.Skus = append(arg.Skus, l.Sku)
		arg.Quantities = append(arg.Quantities, l.Quantity)
	}
	// In SKU order, as a reservation locks them.
	if _, err := s.queries.LockStock(ctx, tx, arg.Skus); err != nil {
		return fmt.Errorf("lock stock of order %s: %w", orderID, err)
	}
	if err := s.queries.IncrementStock(ctx, tx, arg); err != nil {
		return fmt.Errorf("give back stock of order %s: %w", orderID, err)
	}
	if err := s.queries.MarkReleased(ctx, tx, orderID); err != nil {
		return fmt.Errorf("mark reservation of order %s released: %w", orderID, err)
	}
	return nil
}

// HandleOrderExpiredBatch is HandleOrderExpired for an inbox batch. What it
// adds is the lock order: it locks every stock row the batch's releases
// will touch first, in SKU order, as a reservation batch does, so that the
// two cannot deadlock.
func (s *Service) HandleOrderExpiredBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		id, err := expiredOrder(ev)
		if err != nil {
			return err
		}
		ids[i] = id
	}
	skus, err := s.queries.ReservedSkus(ctx, tx, ids)
	if err != nil {
		return fmt.Errorf("read the SKUs of %d reservations: %w", len(ids), err)
	}
	if _, err := s.queries.LockStock(ctx, tx, skus); err != nil {
		return fmt.Errorf("lock stock of %d SKUs: %w", len(skus), err)
	}
	for _, ev := range evs {
		if err := s.HandleOrderExpired(ctx, tx, ev); err != nil {
			return err
		}
	}
	return nil
}

// expiredOrder checks that ev is an OrderExpired and returns its order.
func expiredOrder(ev event.Envelope) (uuid.UUID, error) {
	if ev.Type != event.OrderExpired {
		return uuid.Nil, inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderExpiredV1
	if err := ev.Decode(&p); err != nil {
		return uuid.Nil, err
	}
	return p.OrderID, nil
}

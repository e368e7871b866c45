package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

// Order statuses, as stored and as the API shows them.
const (
	StatusPending   = "PENDING"
	StatusPaid      = "PAID"
	StatusConfirmed = "CONFIRMED"
	StatusRejected  = "REJECTED"
	StatusCancelled = "CANCELLED"
	// StatusExpired ends an order the saga did not finish by its deadline.
	StatusExpired = "EXPIRED"
)

// Reasons of the terminal events when the event that caused them gave none.
const (
	ReasonPaymentRejected = "payment rejected"
	ReasonPaymentRefunded = "payment refunded"
)

// Service is the order service's behaviour: its event handlers and HTTP API.
type Service struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
	idem    *idempotency.Store
	// admission, when set, refuses new orders while the saga is behind.
	admission *Admission
	// perCaller, when set, limits each caller's POST /orders.
	perCaller echo.MiddlewareFunc
	// prices are the catalog's, as last read: POST /orders's guesses.
	prices *knownPrices
	// deadline is how long a new order has before it expires.
	deadline time.Duration
}

// New returns the service on its database.
func New(pool *pgxpool.Pool) *Service {
	return &Service{pool: pool, queries: dbsqlc.New(), idem: idempotency.NewStore(pool, 0), prices: newKnownPrices(), deadline: DefaultDeadline}
}

// handlePaymentEvent is the handler of the PAYMENTS subscription.
func (s *Service) handlePaymentEvent(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	switch ev.Type {
	case event.PaymentDebited:
		return s.HandlePaymentDebited(ctx, tx, ev)
	case event.PaymentRejected:
		return s.HandlePaymentRejected(ctx, tx, ev)
	case event.PaymentRefunded:
		return s.HandlePaymentRefunded(ctx, tx, ev)
	}
	return inbox.Permanent(fmt.Errorf("unexpected event type %s on %s", ev.Type, streams.Payments))
}

// handleInventoryEvent is the handler of the INVENTORY subscription.
func (s *Service) handleInventoryEvent(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	switch ev.Type {
	case event.StockReserved:
		return s.HandleStockReserved(ctx, tx, ev)
	case event.StockRejected:
		return s.HandleStockRejected(ctx, tx, ev)
	}
	return inbox.Permanent(fmt.Errorf("unexpected event type %s on %s", ev.Type, streams.Inventory))
}

// HandlePaymentDebited moves a PENDING order to PAID.
func (s *Service) HandlePaymentDebited(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.PaymentDebitedV1
	if err := decode(ev, event.PaymentDebited, &p); err != nil {
		return err
	}
	return s.apply(ctx, tx, ev, p.OrderID, "")
}

// HandlePaymentRejected moves a PENDING order to REJECTED and emits
// OrderRejected with the payment's reason.
func (s *Service) HandlePaymentRejected(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.PaymentRejectedV1
	if err := decode(ev, event.PaymentRejected, &p); err != nil {
		return err
	}
	return s.apply(ctx, tx, ev, p.OrderID, cmp.Or(p.Reason, ReasonPaymentRejected))
}

// HandlePaymentRefunded moves a PENDING or PAID order to CANCELLED and emits
// OrderCancelled, with the reason of the StockRejected that led to the
// refund when the order has seen it.
func (s *Service) HandlePaymentRefunded(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.PaymentRefundedV1
	if err := decode(ev, event.PaymentRefunded, &p); err != nil {
		return err
	}
	return s.apply(ctx, tx, ev, p.OrderID, "")
}

// HandleStockReserved moves a PENDING or PAID order to CONFIRMED and emits
// OrderConfirmed. Stock is only reserved after a debit, so a PENDING order
// whose PaymentDebited is still to come is confirmed too.
func (s *Service) HandleStockReserved(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.StockReservedV1
	if err := decode(ev, event.StockReserved, &p); err != nil {
		return err
	}
	return s.apply(ctx, tx, ev, p.OrderID, "")
}

// HandleStockRejected records the refusal in the order's timeline and
// changes nothing else: the order waits for the refund that follows it, and
// the refund's OrderCancelled carries this event's reason.
func (s *Service) HandleStockRejected(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.StockRejectedV1
	if err := decode(ev, event.StockRejected, &p); err != nil {
		return err
	}
	return s.apply(ctx, tx, ev, p.OrderID, p.Reason)
}

// decode checks ev's type and decodes its payload into v.
func decode(ev event.Envelope, want event.Type, v any) error {
	if ev.Type != want {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s, want %s", ev.Type, want))
	}
	return ev.Decode(v)
}

// NextStatus is the status an event of type typ moves an order in status
// from to; ok is false when the event changes nothing. No terminal status is
// a "from" here, and every "to" ranks higher than its "from", so a late or
// repeated event never moves an order backwards or out of a terminal state.
// It, Terminal and LateFate are exported for the auditor's test, which holds
// the auditor's own copy of these rules to them.
func NextStatus(from string, typ event.Type) (to string, ok bool) {
	switch {
	case typ == event.PaymentDebited && from == StatusPending:
		return StatusPaid, true
	case typ == event.StockReserved && (from == StatusPending || from == StatusPaid):
		return StatusConfirmed, true
	case typ == event.PaymentRejected && from == StatusPending:
		return StatusRejected, true
	case typ == event.PaymentRefunded && (from == StatusPending || from == StatusPaid):
		return StatusCancelled, true
	}
	return "", false
}

// Fates of a late reply: one that found its order terminal (docs/saga.md).
const (
	// LateRefunded is a PaymentDebited after expiry: payment refunds the
	// debit when it handles the OrderExpired.
	LateRefunded = "refunded"
	// LateReleased is a StockReserved after expiry: inventory releases the
	// reservation when it handles the OrderExpired.
	LateReleased = "released"
	// LateUnchanged is every other reply to a terminal order: it changes
	// nothing, there being nothing to undo.
	LateUnchanged = "unchanged"
)

// Terminal reports whether status ends the order.
func Terminal(status string) bool {
	switch status {
	case StatusConfirmed, StatusRejected, StatusCancelled, StatusExpired:
		return true
	}
	return false
}

// LateFate is the fate of a reply of type typ to an order in status from,
// or "" when the order is still open and the reply is on time.
func LateFate(from string, typ event.Type) string {
	switch {
	case !Terminal(from):
		return ""
	case from == StatusExpired && typ == event.PaymentDebited:
		return LateRefunded
	case from == StatusExpired && typ == event.StockReserved:
		return LateReleased
	}
	return LateUnchanged
}

// apply records ev in the timeline of order orderID and makes the transition
// ev calls for, emitting the terminal event when the order reaches a
// terminal state. reason is ev's reason, if it has one.
func (s *Service) apply(ctx context.Context, tx pgx.Tx, ev event.Envelope, orderID uuid.UUID, reason string) error {
	// The follow-up event inherits ev's subject, which must be the order.
	if ev.Subject != orderID.String() {
		return fmt.Errorf("%w: %s %s: subject %q is not its order %s", event.ErrInvalid, ev.Type, ev.ID, ev.Subject, orderID)
	}
	o, err := s.queries.LockOrder(ctx, tx, orderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Orders are never deleted and their events follow their commit, so
		// no retry will make this order appear.
		return inbox.Permanent(fmt.Errorf("%s %s for unknown order %s", ev.Type, ev.ID, orderID))
	case err != nil:
		return fmt.Errorf("lock order %s: %w", orderID, err)
	}
	recorded, err := s.record(ctx, tx, o.ID, ev, reason, LateFate(o.Status, ev.Type))
	if err != nil {
		return err
	}
	if !recorded {
		// Seen before under another consumer key or after its inbox row
		// expired: its effect happened then.
		return nil
	}
	to, ok := NextStatus(o.Status, ev.Type)
	if !ok {
		return nil
	}
	if err := s.queries.SetOrderStatus(ctx, tx, dbsqlc.SetOrderStatusParams{ID: o.ID, Status: to}); err != nil {
		return fmt.Errorf("set order %s %s: %w", o.ID, to, err)
	}
	return s.emitTerminal(ctx, tx, ev, o, to, reason)
}

// emitTerminal writes the event that announces the order's terminal status
// to, caused by cause; for a status that is not terminal it does nothing.
func (s *Service) emitTerminal(ctx context.Context, tx pgx.Tx, cause event.Envelope, o dbsqlc.Order, to, reason string) error {
	if to == StatusCancelled {
		var err error
		if reason, err = s.cancelReason(ctx, tx, o.ID); err != nil {
			return err
		}
	}
	ev, ok, err := terminalEvent(cause, o, to, reason)
	if err != nil || !ok {
		return err
	}
	if err := outbox.Enqueue(ctx, tx, ev); err != nil {
		return err
	}
	_, err = s.record(ctx, tx, o.ID, ev, reason, "")
	return err
}

// terminalEvent is the event that announces the order's terminal status to,
// caused by cause, with reason (a cancellation's is cancelReason's); ok is
// false for a status that is not terminal.
func terminalEvent(cause event.Envelope, o dbsqlc.Order, to, reason string) (ev event.Envelope, ok bool, err error) {
	ord := event.Order{OrderID: o.ID, CustomerID: o.CustomerID, CustomerEmail: o.CustomerEmail}
	var (
		typ     event.Type
		payload any
	)
	switch to {
	case StatusConfirmed:
		typ, payload = event.OrderConfirmed, event.OrderConfirmedV1{Order: ord, TotalCents: o.TotalCents}
	case StatusRejected:
		typ, payload = event.OrderRejected, event.OrderRejectedV1{Order: ord, Reason: reason}
	case StatusCancelled:
		typ, payload = event.OrderCancelled, event.OrderCancelledV1{Order: ord, Reason: reason}
	default:
		return event.Envelope{}, false, nil
	}
	ev, err = cause.Caused(Name, typ, payload)
	if err != nil {
		return event.Envelope{}, false, err
	}
	return ev, true, nil
}

// cancelReason is why an order is cancelled: the reason of the StockRejected
// in its timeline, or a generic one when the refund overtook it.
func (s *Service) cancelReason(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (string, error) {
	reason, err := s.queries.FirstTimelineReason(ctx, tx, dbsqlc.FirstTimelineReasonParams{
		OrderID:   orderID,
		EventType: string(event.StockRejected),
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read stock rejection of order %s: %w", orderID, err)
	}
	return cmp.Or(reason, ReasonPaymentRefunded), nil
}

// record adds ev to the order's timeline, with its fate when late;
// recorded is false when it was there already.
func (s *Service) record(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, ev event.Envelope, reason, late string) (recorded bool, err error) {
	n, err := s.queries.RecordTimeline(ctx, tx, dbsqlc.RecordTimelineParams{
		OrderID:   orderID,
		EventID:   ev.ID,
		EventType: string(ev.Type),
		At:        ev.Time,
		Reason:    reason,
		Late:      late,
	})
	if err != nil {
		return false, fmt.Errorf("record %s %s of order %s: %w", ev.Type, ev.ID, orderID, err)
	}
	return n == 1, nil
}

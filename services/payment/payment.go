package payment

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/services/payment/internal/dbsqlc"
)

// Payment statuses, as stored.
const (
	StatusDebited  = "DEBITED"
	StatusRejected = "REJECTED"
	StatusRefunded = "REFUNDED"
	// StatusExpired is an order that expired before payment decided: it is
	// never debited.
	StatusExpired = "EXPIRED"
)

// ReasonOrderExpired is the reason of a payment refunded, or never made,
// because its order expired.
const ReasonOrderExpired = "order expired"

// ReasonInsufficientFunds is the reason of a PaymentRejected for funds.
const ReasonInsufficientFunds = "insufficient funds"

// Service is the payment service's behaviour: its event handlers and HTTP API.
type Service struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
	idem    *idempotency.Store
}

// New returns the service on its database.
func New(pool *pgxpool.Pool) *Service {
	return &Service{pool: pool, queries: dbsqlc.New(), idem: idempotency.NewStore(pool, 0)}
}

// HandleOrderPlaced debits the order's total from the customer's wallet, or
// rejects the payment when the balance does not cover it.
func (s *Service) HandleOrderPlaced(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderPlaced {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderPlacedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	// An order is paid at most once, whatever events say: the payment row is
	// the decision, and a second event for the same order finds it.
	_, err := s.queries.LockPayment(ctx, tx, p.OrderID)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("lock payment of order %s: %w", p.OrderID, err)
	}

	status, reason := StatusDebited, ""
	if _, err := s.queries.DebitWallet(ctx, tx, dbsqlc.DebitWalletParams{CustomerID: p.CustomerID, AmountCents: p.TotalCents}); err != nil {
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("debit wallet of %s: %w", p.CustomerID, err)
		}
		status, reason = StatusRejected, ReasonInsufficientFunds
	}
	if err := s.queries.InsertPayment(ctx, tx, dbsqlc.InsertPaymentParams{
		OrderID:     p.OrderID,
		CustomerID:  p.CustomerID,
		AmountCents: p.TotalCents,
		Status:      status,
		Reason:      reason,
	}); err != nil {
		return fmt.Errorf("record payment of order %s: %w", p.OrderID, err)
	}

	if status == StatusRejected {
		return emit(ctx, tx, ev, event.PaymentRejected, event.PaymentRejectedV1{Order: p.Order, AmountCents: p.TotalCents, Reason: reason})
	}
	return emit(ctx, tx, ev, event.PaymentDebited, event.PaymentDebitedV1{Order: p.Order, Lines: p.Lines, AmountCents: p.TotalCents})
}

// HandleStockRejected refunds the order's debit, once: only a DEBITED
// payment is refunded, and it becomes REFUNDED in the same transaction.
func (s *Service) HandleStockRejected(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.StockRejected {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.StockRejectedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	payment, err := s.queries.LockPayment(ctx, tx, p.OrderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Stock is only ever refused after a debit; without one, there is
		// nothing to give back and retrying will not change that.
		return inbox.Permanent(fmt.Errorf("stock rejected for order %s, which has no payment", p.OrderID))
	case err != nil:
		return fmt.Errorf("lock payment of order %s: %w", p.OrderID, err)
	case payment.Status != StatusDebited:
		return nil // already refunded (or never debited): nothing to undo
	}
	return s.refund(ctx, tx, ev, p.Order, payment, "")
}

// HandleOrderExpired undoes what payment did for an order that expired:
// a debit is refunded, once (only a DEBITED payment is, and it becomes
// REFUNDED in the same transaction, whether a stock refusal or the expiry
// comes first). An order not yet decided gets an EXPIRED payment, so that
// its OrderPlaced, when it comes after, debits nothing: the OrderExpired
// may overtake it, on a durable of its own.
func (s *Service) HandleOrderExpired(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderExpired {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderExpiredV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	payment, err := s.queries.LockPayment(ctx, tx, p.OrderID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// An OrderPlaced being handled at the same time inserts the same
		// key: one of the two fails on it and is retried, and finds the
		// other's decision.
		if err := s.queries.InsertPayment(ctx, tx, dbsqlc.InsertPaymentParams{
			OrderID:     p.OrderID,
			CustomerID:  p.CustomerID,
			AmountCents: p.TotalCents,
			Status:      StatusExpired,
			Reason:      ReasonOrderExpired,
		}); err != nil {
			return fmt.Errorf("record expiry of order %s: %w", p.OrderID, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("lock payment of order %s: %w", p.OrderID, err)
	case payment.Status != StatusDebited:
		return nil // rejected, refunded or expired already: nothing to undo
	}
	return s.refund(ctx, tx, ev, p.Order, payment, ReasonOrderExpired)
}

// refund gives the locked, debited payment back to its wallet, marks it
// REFUNDED and emits PaymentRefunded, caused by cause.
func (s *Service) refund(ctx context.Context, tx pgx.Tx, cause event.Envelope, o event.Order, payment dbsqlc.LockPaymentRow, reason string) error {
	if err := s.queries.MarkRefunded(ctx, tx, dbsqlc.MarkRefundedParams{OrderID: o.OrderID, Reason: reason}); err != nil {
		return fmt.Errorf("mark order %s refunded: %w", o.OrderID, err)
	}
	if err := s.queries.RefundWallet(ctx, tx, dbsqlc.RefundWalletParams{CustomerID: payment.CustomerID, AmountCents: payment.AmountCents}); err != nil {
		return fmt.Errorf("refund wallet of %s: %w", payment.CustomerID, err)
	}
	return emit(ctx, tx, cause, event.PaymentRefunded, event.PaymentRefundedV1{
		Order:       event.Order{OrderID: o.OrderID, CustomerID: payment.CustomerID, CustomerEmail: o.CustomerEmail},
		AmountCents: payment.AmountCents,
	})
}

// emit writes the event that cause caused to the outbox.
func emit(ctx context.Context, tx pgx.Tx, cause event.Envelope, typ event.Type, payload any) error {
	ev, err := cause.Caused(Name, typ, payload)
	if err != nil {
		return err
	}
	return outbox.Enqueue(ctx, tx, ev)
}

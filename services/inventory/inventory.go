package inventory

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/services/inventory/internal/dbsqlc"
)

// Reservation statuses, as stored.
const (
	StatusReserved = "RESERVED"
	StatusRejected = "REJECTED"
)

// Service is the inventory service's behaviour: its event handler and HTTP API.
type Service struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
	idem    *idempotency.Store
}

// New returns the service on its database.
func New(pool *pgxpool.Pool) *Service {
	return &Service{pool: pool, queries: dbsqlc.New(), idem: idempotency.NewStore(pool, 0)}
}

// HandlePaymentDebited reserves every line of the debited order, or none: an
// unknown SKU or a short line rejects the whole order, and the rejection
// carries the debited amount so that payment can refund it.
func (s *Service) HandlePaymentDebited(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.PaymentDebited {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.PaymentDebitedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	skus, quantities := demand(p.Lines)
	// Locking before deciding makes the decision hold until commit: no other
	// order can take the stock it saw in between.
	stock, err := s.queries.LockStock(ctx, tx, skus)
	if err != nil {
		return fmt.Errorf("lock stock of order %s: %w", p.OrderID, err)
	}
	status, reason := StatusReserved, shortfall(skus, quantities, stock)
	if reason != "" {
		status = StatusRejected
	}
	// The reservation row is the order's one decision. Another event for the
	// same order (a re-emitted PaymentDebited under a new id) may have made
	// it already; then it stands and this event changes nothing.
	n, err := s.queries.InsertReservation(ctx, tx, dbsqlc.InsertReservationParams{OrderID: p.OrderID, Status: status, Reason: reason})
	switch {
	case err != nil:
		return fmt.Errorf("record reservation of order %s: %w", p.OrderID, err)
	case n == 0:
		return nil
	case status == StatusRejected:
		return emit(ctx, tx, ev, event.StockRejected, event.StockRejectedV1{Order: p.Order, AmountCents: p.AmountCents, Reason: reason})
	}

	// The rows are locked and were checked: stock that does not cover the
	// order cannot happen unless the locking is broken, and then the
	// stock's CHECK fails the statement rather than oversell.
	ones := slices.Repeat([]int64{1}, len(skus))
	if err := s.queries.DecrementStock(ctx, tx, dbsqlc.DecrementStockParams{Skus: skus, Quantities: quantities, Writes: ones}); err != nil {
		return fmt.Errorf("decrement stock for order %s: %w", p.OrderID, err)
	}
	if err := s.queries.InsertReservationLines(ctx, tx, dbsqlc.InsertReservationLinesParams{OrderID: p.OrderID, Skus: skus, Quantities: quantities}); err != nil {
		return fmt.Errorf("record reservation lines of order %s: %w", p.OrderID, err)
	}
	return emit(ctx, tx, ev, event.StockReserved, event.StockReservedV1{Order: p.Order, Lines: p.Lines})
}

// demand sums the lines' quantities per SKU (an order may repeat a SKU), in
// SKU order, which is the order its stock rows are locked and updated in.
func demand(lines event.Lines) (skus []string, quantities []int64) {
	sum := make(map[string]int64, len(lines))
	for _, l := range lines {
		sum[l.SKU] += int64(l.Quantity)
	}
	skus = slices.Sorted(maps.Keys(sum))
	quantities = make([]int64, len(skus))
	for i, sku := range skus {
		quantities[i] = sum[sku]
	}
	return skus, quantities
}

// shortfall says why stock cannot cover quantities of skus, naming the first
// SKU in SKU order that is unknown or short; it is empty when stock covers
// every SKU.
func shortfall(skus []string, quantities []int64, stock []dbsqlc.LockStockRow) string {
	available := make(map[string]int64, len(stock))
	for _, row := range stock {
		available[row.Sku] = row.Available
	}
	for i, sku := range skus {
		have, ok := available[sku]
		switch {
		case !ok:
			return fmt.Sprintf("unknown sku %q", sku)
		case have < quantities[i]:
			return fmt.Sprintf("insufficient stock of sku %q: %d wanted, %d available", sku, quantities[i], have)
		}
	}
	return ""
}

// emit writes the event that cause caused to the outbox.
func emit(ctx context.Context, tx pgx.Tx, cause event.Envelope, typ event.Type, payload any) error {
	ev, err := cause.Caused(Name, typ, payload)
	if err != nil {
		return err
	}
	return outbox.Enqueue(ctx, tx, ev)
}

package inventory

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/inventory/internal/dbsqlc"
)

// HandlePaymentDebitedBatch is the set-based form of HandlePaymentDebited
// for the new PaymentDebited events of an inbox batch: it leaves the
// database as HandlePaymentDebited called for each event in turn would, in
// five statements and one round trip whatever the batch size, plus its
// writes, which go with the inbox's COMMIT.
//
// It locks the stock rows of every SKU of the batch once, in SKU order (the
// order HandlePaymentDebited locks an order's SKUs in; the inbox's
// per-event fallback runs one event per transaction, so neither form can
// deadlock the other), decides each order in event order in Go against the stock the
// orders before it left, and then writes the net decrement per SKU, the
// reservations, their lines and the outcome events with one statement each,
// queued on writes.
//
// It does not look up whether an order was decided before: only an event
// re-emitted under a new id (never the case in this saga; a redelivery
// keeps its id and is dropped by the inbox), or another transaction
// deciding the same order at the same time, can meet one, and then the
// reservation's primary key fails the batch's writes. Any error makes the
// inbox fall back to HandlePaymentDebited per event, which leaves the first
// decision standing.
func (s *Service) HandlePaymentDebitedBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	debited, allSKUs, err := decodeDebited(evs)
	if err != nil {
		return err
	}
	// Locking before deciding makes the decisions hold until commit.
	stock, err := s.queries.LockStock(ctx, tx, allSKUs)
	if err != nil {
		return fmt.Errorf("lock stock of %d skus: %w", len(allSKUs), err)
	}
	available := make(map[string]int64, len(stock))
	for _, row := range stock {
		available[row.Sku] = row.Available
	}
	// The reservation row is an order's one decision: a second event for
	// an order of this batch changes nothing.
	decided := make(map[uuid.UUID]bool, len(evs))
	var (
		reservations []dbsqlc.InsertReservationParams
		lines        dbsqlc.InsertReservationLinesOfOrdersParams
		taken        = make(map[string]take)
		emitted      []event.Envelope
	)
	for i, p := range debited {
		if decided[p.OrderID] {
			continue
		}
		decided[p.OrderID] = true
		skus, quantities := demand(p.Lines)
		// The stock as this order sees it: what the orders before it left.
		seen := make([]dbsqlc.LockStockRow, 0, len(skus))
		for _, sku := range skus {
			if have, ok := available[sku]; ok {
				seen = append(seen, dbsqlc.LockStockRow{Sku: sku, Available: have})
			}
		}
		reason := shortfall(skus, quantities, seen)
		var next event.Envelope
		if reason != "" {
			reservations = append(reservations, dbsqlc.InsertReservationParams{OrderID: p.OrderID, Status: StatusRejected, Reason: reason})
			next, err = evs[i].Caused(Name, event.StockRejected, event.StockRejectedV1{Order: p.Order, AmountCents: p.AmountCents, Reason: reason})
		} else {
			reservations = append(reservations, dbsqlc.InsertReservationParams{OrderID: p.OrderID, Status: StatusReserved})
			for j, sku := range skus {
				available[sku] -= quantities[j]
				taken[sku] = take{quantity: taken[sku].quantity + quantities[j], writes: taken[sku].writes + 1}
				lines.OrderIds = append(lines.OrderIds, p.OrderID)
				lines.Skus = append(lines.Skus, sku)
				lines.Quantities = append(lines.Quantities, quantities[j])
			}
			next, err = evs[i].Caused(Name, event.StockReserved, event.StockReservedV1{Order: p.Order, Lines: p.Lines})
		}
		if err != nil {
			return err
		}
		emitted = append(emitted, next)
	}

	// The writes need no answer from each other: they go with the COMMIT.
	if err := s.decrementStock(ctx, writes, taken); err != nil {
		return err
	}
	if err := s.insertReservations(ctx, writes, reservations); err != nil {
		return err
	}
	if len(lines.OrderIds) > 0 {
		if err := s.queries.InsertReservationLinesOfOrders(ctx, writes, lines); err != nil {
			return fmt.Errorf("record reservation lines of %d orders: %w", len(reservations), err)
		}
	}
	return outbox.QueueBatch(ctx, writes, emitted)
}

// decodeDebited decodes the PaymentDebited events evs and returns the SKUs
// of all their lines, sorted.
func decodeDebited(evs []event.Envelope) ([]event.PaymentDebitedV1, []string, error) {
	debited := make([]event.PaymentDebitedV1, len(evs))
	allSKUs := make(map[string]bool)
	for i, ev := range evs {
		if ev.Type != event.PaymentDebited {
			return nil, nil, inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
		}
		if err := ev.Decode(&debited[i]); err != nil {
			return nil, nil, err
		}
		for _, l := range debited[i].Lines {
			allSKUs[l.SKU] = true
		}
	}
	return debited, slices.Sorted(maps.Keys(allSKUs)), nil
}

// take is what a batch's reservations take from one SKU: the sum of their
// quantities, and how many of them there are.
type take struct{ quantity, writes int64 }

// decrementStock queues the net decrement of each SKU, in SKU order.
func (s *Service) decrementStock(ctx context.Context, writes *postgres.Pipeline, taken map[string]take) error {
	if len(taken) == 0 {
		return nil
	}
	arg := dbsqlc.DecrementStockParams{Skus: slices.Sorted(maps.Keys(taken))}
	arg.Quantities, arg.Writes = make([]int64, len(arg.Skus)), make([]int64, len(arg.Skus))
	for i, sku := range arg.Skus {
		arg.Quantities[i], arg.Writes[i] = taken[sku].quantity, taken[sku].writes
	}
	// The rows are locked and were checked: stock that does not cover its
	// decrement cannot happen unless the locking is broken, and then the
	// stock's CHECK fails the statement.
	if err := s.queries.DecrementStock(ctx, writes, arg); err != nil {
		return fmt.Errorf("decrement stock of %d skus: %w", len(arg.Skus), err)
	}
	return nil
}

// insertReservations queues the decisions in order id order, so that two
// batches that carry the same order insert their keys in the same order. An
// order that another transaction decided meanwhile is a unique violation.
func (s *Service) insertReservations(ctx context.Context, writes *postgres.Pipeline, rs []dbsqlc.InsertReservationParams) error {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b dbsqlc.InsertReservationParams) int {
		return bytes.Compare(a.OrderID[:], b.OrderID[:])
	})
	arg := dbsqlc.InsertReservationsParams{
		OrderIds: make([]uuid.UUID, len(rs)),
		Statuses: make([]string, len(rs)),
		Reasons:  make([]string, len(rs)),
	}
	for i, r := range rs {
		arg.OrderIds[i], arg.Statuses[i], arg.Reasons[i] = r.OrderID, r.Status, r.Reason
	}
	if err := s.queries.InsertReservations(ctx, writes, arg); err != nil {
		return fmt.Errorf("record %d reservations: %w", len(rs), err)
	}
	return nil
}

package order

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

// The event types each subscription carries, as its handler accepts them.
var (
	paymentTypes   = []event.Type{event.PaymentDebited, event.PaymentRejected, event.PaymentRefunded}
	inventoryTypes = []event.Type{event.StockReserved, event.StockRejected}
)

// batchHandler is the set-based form of the handler of a subscription that
// carries events of types. An event of another type fails the batch, so that
// the subscription's handler refuses it on its own as it would unbatched.
func (s *Service) batchHandler(types []event.Type) inbox.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
		for _, ev := range evs {
			if !slices.Contains(types, ev.Type) {
				return inbox.Permanent(fmt.Errorf("unexpected event type %s of event %s", ev.Type, ev.ID))
			}
		}
		return s.HandleBatch(ctx, tx, evs, writes)
	}
}

// consumed is a consumed event of a batch with what apply needs of it.
type consumed struct {
	ev      event.Envelope
	orderID uuid.UUID
	reason  string // recorded with it in the timeline
}

// timelineKey is a timeline row's key.
type timelineKey struct{ orderID, eventID uuid.UUID }

// ending is an order reaching its terminal status to through the event at
// position pos of a batch.
type ending struct {
	pos int
	to  string
}

// HandleBatch is the set-based form of the handlers of both subscriptions
// for the new events of an inbox batch: it leaves the database as the
// handler of each event's type, called for each event in turn, would, in at
// most six statements and three round trips whatever the batch size, plus
// its writes, which go with the inbox's COMMIT.
//
// It locks the batch's orders once, in id order (so that the two
// subscriptions' batches cannot deadlock each other; the per-event
// fallback runs one event per transaction and locks one order), records the events in
// the timelines with one statement, which tells which of them were seen
// before, and decides every transition in Go in event order on the orders'
// statuses as they evolve: two events of one order in one batch see each
// other's effect, as they would one after the other. Then it reads the
// reasons of the cancellations, and writes the statuses, the terminal events
// and their timeline entries, with one statement each, queued on writes. Any
// error makes the inbox fall back to the handler per event, which settles a
// bad event alone.
func (s *Service) HandleBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error {
	cs := make([]consumed, len(evs))
	for i, ev := range evs {
		c, err := decodeConsumed(ev)
		if err != nil {
			return err
		}
		cs[i] = c
	}
	if len(cs) == 0 {
		return nil
	}
	locked, err := s.lockBatchOrders(ctx, tx, cs)
	if err != nil {
		return err
	}
	newAt, err := s.recordConsumed(ctx, tx, cs)
	if err != nil {
		return err
	}

	orders := make(map[uuid.UUID]dbsqlc.Order, len(locked))
	status := make(map[uuid.UUID]string, len(locked))
	for _, o := range locked {
		orders[o.ID], status[o.ID] = o, o.Status
	}
	var (
		ends []ending
		late dbsqlc.MarkLateParams
	)
	for i, c := range cs {
		// An event seen before (or earlier in this batch) changes nothing.
		if pos, ok := newAt[timelineKey{c.orderID, c.ev.ID}]; !ok || pos != i {
			continue
		}
		if fate := LateFate(status[c.orderID], c.ev.Type); fate != "" {
			late.OrderIds = append(late.OrderIds, c.orderID)
			late.EventIds = append(late.EventIds, c.ev.ID)
			late.Lates = append(late.Lates, fate)
		}
		to, ok := NextStatus(status[c.orderID], c.ev.Type)
		if !ok {
			continue
		}
		status[c.orderID] = to
		if Terminal(to) {
			ends = append(ends, ending{pos: i, to: to})
		}
	}

	reasons, err := s.cancelReasons(ctx, tx, cs, newAt, ends)
	if err != nil {
		return err
	}
	// The writes need no answer from each other: they go with the COMMIT.
	if err := s.setStatuses(ctx, writes, locked, status); err != nil {
		return err
	}
	if len(late.EventIds) > 0 {
		if err := s.queries.MarkLate(ctx, writes, late); err != nil {
			return fmt.Errorf("record the fates of %d late events: %w", len(late.EventIds), err)
		}
	}
	return s.emitTerminals(ctx, writes, cs, orders, ends, reasons)
}

// decodeConsumed checks and decodes ev as the handler of its type does.
func decodeConsumed(ev event.Envelope) (consumed, error) {
	var (
		ref    event.Order
		reason string
		err    error
	)
	switch ev.Type {
	case event.PaymentDebited:
		var p event.PaymentDebitedV1
		err = ev.Decode(&p)
		ref = p.Order
	case event.PaymentRejected:
		var p event.PaymentRejectedV1
		err = ev.Decode(&p)
		ref, reason = p.Order, cmp.Or(p.Reason, ReasonPaymentRejected)
	case event.PaymentRefunded:
		var p event.PaymentRefundedV1
		err = ev.Decode(&p)
		ref = p.Order
	case event.StockReserved:
		var p event.StockReservedV1
		err = ev.Decode(&p)
		ref = p.Order
	case event.StockRejected:
		var p event.StockRejectedV1
		err = ev.Decode(&p)
		ref, reason = p.Order, p.Reason
	default:
		return consumed{}, inbox.Permanent(fmt.Errorf("unexpected event type %s of event %s", ev.Type, ev.ID))
	}
	if err != nil {
		return consumed{}, err
	}
	if ev.Subject != ref.OrderID.String() {
		return consumed{}, fmt.Errorf("%w: %s %s: subject %q is not its order %s", event.ErrInvalid, ev.Type, ev.ID, ev.Subject, ref.OrderID)
	}
	return consumed{ev: ev, orderID: ref.OrderID, reason: reason}, nil
}

// lockBatchOrders locks the orders of cs and returns them in id order. An
// unknown order fails the batch; the handler then refuses its event alone.
func (s *Service) lockBatchOrders(ctx context.Context, tx pgx.Tx, cs []consumed) ([]dbsqlc.Order, error) {
	ids := make([]uuid.UUID, 0, len(cs))
	seen := make(map[uuid.UUID]bool, len(cs))
	for _, c := range cs {
		if !seen[c.orderID] {
			seen[c.orderID] = true
			ids = append(ids, c.orderID)
		}
	}
	locked, err := s.queries.LockOrders(ctx, tx, ids)
	if err != nil {
		return nil, fmt.Errorf("lock %d orders: %w", len(ids), err)
	}
	if len(locked) < len(ids) {
		for _, o := range locked {
			delete(seen, o.ID)
		}
		for _, c := range cs {
			if seen[c.orderID] {
				return nil, fmt.Errorf("%s %s for unknown order %s", c.ev.Type, c.ev.ID, c.orderID)
			}
		}
	}
	return locked, nil
}

// recordConsumed adds the events of cs to their orders' timelines and
// returns, for each row it added, the position in cs of the event that added
// it, as recording one event after the other would have: the first copy of
// an event that is there twice.
func (s *Service) recordConsumed(ctx context.Context, tx pgx.Tx, cs []consumed) (map[timelineKey]int, error) {
	first := make(map[timelineKey]int, len(cs))
	var arg dbsqlc.RecordTimelinesParams
	for i, c := range cs {
		k := timelineKey{c.orderID, c.ev.ID}
		if _, ok := first[k]; ok {
			continue
		}
		first[k] = i
		arg.OrderIds = append(arg.OrderIds, c.orderID)
		arg.EventIds = append(arg.EventIds, c.ev.ID)
		arg.EventTypes = append(arg.EventTypes, string(c.ev.Type))
		arg.Ats = append(arg.Ats, c.ev.Time)
		arg.Reasons = append(arg.Reasons, c.reason)
	}
	rows, err := s.queries.RecordTimelines(ctx, tx, arg)
	if err != nil {
		return nil, fmt.Errorf("record %d events in the timelines: %w", len(arg.EventIds), err)
	}
	newAt := make(map[timelineKey]int, len(rows))
	for _, r := range rows {
		k := timelineKey{r.OrderID, r.EventID}
		newAt[k] = first[k]
	}
	return newAt, nil
}

// setStatuses queues the statuses of the orders whose status changed. No
// transition leads back to where it started, so an order whose status is
// what it was locked with saw none.
func (s *Service) setStatuses(ctx context.Context, writes *postgres.Pipeline, locked []dbsqlc.Order, status map[uuid.UUID]string) error {
	var arg dbsqlc.SetOrderStatusesParams
	for _, o := range locked {
		if to := status[o.ID]; to != o.Status {
			arg.Ids = append(arg.Ids, o.ID)
			arg.Statuses = append(arg.Statuses, to)
		}
	}
	if len(arg.Ids) == 0 {
		return nil
	}
	if err := s.queries.SetOrderStatuses(ctx, writes, arg); err != nil {
		return fmt.Errorf("set the status of %d orders: %w", len(arg.Ids), err)
	}
	return nil
}

// emitTerminals queues the terminal events of ends for the outbox, in event
// order, and their entries in their orders' timelines; reasons are the
// cancellations' (cancelReasons).
func (s *Service) emitTerminals(ctx context.Context, writes *postgres.Pipeline, cs []consumed, orders map[uuid.UUID]dbsqlc.Order,
	ends []ending, reasons map[int]string,
) error {
	if len(ends) == 0 {
		return nil
	}
	var (
		emitted []event.Envelope
		arg     dbsqlc.InsertTimelinesParams
	)
	for _, e := range ends {
		c := cs[e.pos]
		reason := c.reason
		if e.to == StatusCancelled {
			reason = reasons[e.pos]
		}
		ev, _, err := terminalEvent(c.ev, orders[c.orderID], e.to, reason)
		if err != nil {
			return err
		}
		emitted = append(emitted, ev)
		arg.OrderIds = append(arg.OrderIds, c.orderID)
		arg.EventIds = append(arg.EventIds, ev.ID)
		arg.EventTypes = append(arg.EventTypes, string(ev.Type))
		arg.Ats = append(arg.Ats, ev.Time)
		arg.Reasons = append(arg.Reasons, reason)
	}
	if err := outbox.QueueBatch(ctx, writes, emitted); err != nil {
		return err
	}
	if err := s.queries.InsertTimelines(ctx, writes, arg); err != nil {
		return fmt.Errorf("record %d terminal events in the timelines: %w", len(emitted), err)
	}
	return nil
}

// cancelReasons returns, by position in cs, the reasons of the cancellations
// among ends, as cancelReason would read them at that point: the first
// StockRejected by (at, event_id) in the order's timeline, leaving out those
// that later events of the batch added.
func (s *Service) cancelReasons(ctx context.Context, tx pgx.Tx, cs []consumed, newAt map[timelineKey]int, ends []ending) (map[int]string, error) {
	var ids []uuid.UUID
	for _, e := range ends {
		if e.to == StatusCancelled {
			ids = append(ids, cs[e.pos].orderID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.queries.ListTimelineReasons(ctx, tx, dbsqlc.ListTimelineReasonsParams{
		OrderIds:  ids,
		EventType: string(event.StockRejected),
	})
	if err != nil {
		return nil, fmt.Errorf("read stock rejections of %d orders: %w", len(ids), err)
	}
	byOrder := make(map[uuid.UUID][]dbsqlc.ListTimelineReasonsRow, len(ids))
	for _, r := range rows {
		byOrder[r.OrderID] = append(byOrder[r.OrderID], r)
	}
	reasons := make(map[int]string, len(ids))
	for _, e := range ends {
		if e.to != StatusCancelled {
			continue
		}
		reason := ""
		// The rows come in timeline order: the first one there at e.pos
		// is cancelReason's answer.
		for _, r := range byOrder[cs[e.pos].orderID] {
			if pos, ok := newAt[timelineKey{r.OrderID, r.EventID}]; ok && pos > e.pos {
				continue
			}
			reason = r.Reason
			break
		}
		reasons[e.pos] = cmp.Or(reason, ReasonPaymentRefunded)
	}
	return reasons, nil
}

package order_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/order"
)

func TestHappyPath(t *testing.T) {
	t.Parallel()
	svc := start(t)
	placed := svc.Watch(t, streams.Orders, "orders.placed.v1")
	confirmed := svc.Watch(t, streams.Orders, "orders.confirmed.v1")
	o := place(t, svc, "alice")
	s := saga{t, o}

	got := placed.Wait(t, 1)[0]
	require.Equal(t, event.OrderPlaced, got.Type)
	require.Equal(t, order.Name, got.Source)
	require.Equal(t, o.ID.String(), got.Subject)
	var p event.OrderPlacedV1
	require.NoError(t, got.Decode(&p))
	require.Equal(t, event.OrderPlacedV1{
		Order: event.Order{OrderID: o.ID, CustomerID: "alice", CustomerEmail: "alice@example.com"},
		Lines: event.Lines{
			{SKU: "apple", Quantity: 2, UnitPriceCents: 250},
			{SKU: "pear", Quantity: 1, UnitPriceCents: 1000},
		},
		TotalCents: 1500,
	}, p)
	require.Equal(t, got.ID, o.Timeline[0].EventID, "OrderPlaced is in the timeline")

	debited := s.debited()
	o = publishAndAwait(t, svc, o.ID, debited)
	require.Equal(t, order.StatusPaid, o.Status)

	reserved := s.reserved()
	reserved.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	o = publishAndAwait(t, svc, o.ID, reserved)
	require.Equal(t, order.StatusConfirmed, o.Status)
	require.Equal(t, []event.Type{event.OrderPlaced, event.PaymentDebited, event.StockReserved, event.OrderConfirmed}, types(o.Timeline))

	got = confirmed.Wait(t, 1)[0]
	require.Equal(t, order.Name, got.Source)
	require.Equal(t, o.ID.String(), got.Subject)
	require.Equal(t, reserved.TraceParent, got.TraceParent, "the terminal event continues the trace of its cause")
	require.Equal(t, o.Timeline[3].EventID, got.ID)
	var c event.OrderConfirmedV1
	require.NoError(t, got.Decode(&c))
	require.Equal(t, event.OrderConfirmedV1{
		Order:      event.Order{OrderID: o.ID, CustomerID: "alice", CustomerEmail: "alice@example.com"},
		TotalCents: 1500,
	}, c)
}

func TestPaymentRejected(t *testing.T) {
	t.Parallel()
	svc := start(t)
	rejected := svc.Watch(t, streams.Orders, "orders.rejected.v1")
	o := place(t, svc, "bob")
	s := saga{t, o}

	o = publishAndAwait(t, svc, o.ID, s.paymentRejected("insufficient funds"))
	require.Equal(t, order.StatusRejected, o.Status)
	require.Equal(t, []event.Type{event.OrderPlaced, event.PaymentRejected, event.OrderRejected}, types(o.Timeline))

	var p event.OrderRejectedV1
	require.NoError(t, rejected.Wait(t, 1)[0].Decode(&p))
	require.Equal(t, event.OrderRejectedV1{
		Order:  event.Order{OrderID: o.ID, CustomerID: "bob", CustomerEmail: "bob@example.com"},
		Reason: "insufficient funds",
	}, p)
}

func TestCancelledAfterStockRejectedAndRefund(t *testing.T) {
	t.Parallel()
	svc := start(t)
	cancelled := svc.Watch(t, streams.Orders, "orders.cancelled.v1")
	o := place(t, svc, "carol")
	s := saga{t, o}

	o = publishAndAwait(t, svc, o.ID, s.debited())
	require.Equal(t, order.StatusPaid, o.Status)
	o = publishAndAwait(t, svc, o.ID, s.stockRejected("out of stock: pear"))
	require.Equal(t, order.StatusPaid, o.Status, "a stock refusal waits for its refund")
	require.Zero(t, outboxed(t, svc, o.ID, event.OrderCancelled))

	o = publishAndAwait(t, svc, o.ID, s.refunded())
	require.Equal(t, order.StatusCancelled, o.Status)
	require.Equal(t, []event.Type{event.OrderPlaced, event.PaymentDebited, event.StockRejected, event.PaymentRefunded, event.OrderCancelled}, types(o.Timeline))

	var p event.OrderCancelledV1
	require.NoError(t, cancelled.Wait(t, 1)[0].Decode(&p))
	require.Equal(t, event.OrderCancelledV1{
		Order:  event.Order{OrderID: o.ID, CustomerID: "carol", CustomerEmail: "carol@example.com"},
		Reason: "out of stock: pear",
	}, p)
}

func TestRefundBeforeStockRejectedCancelsWithGenericReason(t *testing.T) {
	t.Parallel()
	svc := start(t)
	cancelled := svc.Watch(t, streams.Orders, "orders.cancelled.v1")
	o := place(t, svc, "dave")
	s := saga{t, o}

	// The two subscriptions are independent: the refund can be processed
	// before the stock refusal that caused it, even before the debit.
	stockRejected, debited := s.stockRejected("out of stock: apple"), s.debited()
	o = publishAndAwait(t, svc, o.ID, s.refunded())
	require.Equal(t, order.StatusCancelled, o.Status)
	o = publishAndAwait(t, svc, o.ID, stockRejected)
	o = publishAndAwait(t, svc, o.ID, debited)
	require.Equal(t, order.StatusCancelled, o.Status)
	require.Len(t, o.Timeline, 5)

	var p event.OrderCancelledV1
	require.NoError(t, cancelled.Wait(t, 1)[0].Decode(&p))
	require.Equal(t, order.ReasonPaymentRefunded, p.Reason)
	require.Equal(t, 1, outboxed(t, svc, o.ID, event.OrderCancelled))
}

func TestStockReservedBeforePaymentDebited(t *testing.T) {
	t.Parallel()
	svc := start(t)
	o := place(t, svc, "erin")
	s := saga{t, o}
	// Created in saga order, processed in reverse, as in a replay.
	debited, reserved := s.debited(), s.reserved()

	o = publishAndAwait(t, svc, o.ID, reserved)
	require.Equal(t, order.StatusConfirmed, o.Status)
	require.Equal(t, 1, outboxed(t, svc, o.ID, event.OrderConfirmed))

	o = publishAndAwait(t, svc, o.ID, debited)
	require.Equal(t, order.StatusConfirmed, o.Status, "a late debit does not move the order back")
	require.Equal(t, 1, outboxed(t, svc, o.ID, event.OrderConfirmed))
	require.ElementsMatch(t, []event.Type{event.OrderPlaced, event.PaymentDebited, event.StockReserved, event.OrderConfirmed}, types(o.Timeline))
}

// TestTransitions applies each consumed event to an order in each status.
func TestTransitions(t *testing.T) {
	t.Parallel()
	svc := start(t)

	// How to bring a new order to each status.
	reach := map[string]func(saga) []event.Envelope{
		order.StatusPending:   func(saga) []event.Envelope { return nil },
		order.StatusPaid:      func(s saga) []event.Envelope { return []event.Envelope{s.debited()} },
		order.StatusConfirmed: func(s saga) []event.Envelope { return []event.Envelope{s.debited(), s.reserved()} },
		order.StatusRejected:  func(s saga) []event.Envelope { return []event.Envelope{s.paymentRejected("no money")} },
		order.StatusCancelled: func(s saga) []event.Envelope {
			return []event.Envelope{s.debited(), s.stockRejected("no stock"), s.refunded()}
		},
	}
	incoming := map[event.Type]func(saga) event.Envelope{
		event.PaymentDebited:  saga.debited,
		event.PaymentRejected: func(s saga) event.Envelope { return s.paymentRejected("late") },
		event.PaymentRefunded: saga.refunded,
		event.StockReserved:   saga.reserved,
		event.StockRejected:   func(s saga) event.Envelope { return s.stockRejected("late") },
	}
	terminalEvent := map[string]event.Type{
		order.StatusConfirmed: event.OrderConfirmed,
		order.StatusRejected:  event.OrderRejected,
		order.StatusCancelled: event.OrderCancelled,
	}
	tests := []struct {
		from string
		typ  event.Type
		want string
	}{
		{order.StatusPending, event.PaymentDebited, order.StatusPaid},
		{order.StatusPending, event.PaymentRejected, order.StatusRejected},
		{order.StatusPending, event.PaymentRefunded, order.StatusCancelled},
		{order.StatusPending, event.StockReserved, order.StatusConfirmed},
		{order.StatusPending, event.StockRejected, order.StatusPending},

		{order.StatusPaid, event.PaymentDebited, order.StatusPaid},
		{order.StatusPaid, event.PaymentRejected, order.StatusPaid},
		{order.StatusPaid, event.PaymentRefunded, order.StatusCancelled},
		{order.StatusPaid, event.StockReserved, order.StatusConfirmed},
		{order.StatusPaid, event.StockRejected, order.StatusPaid},
	}
	for _, terminal := range []string{order.StatusConfirmed, order.StatusRejected, order.StatusCancelled} {
		for _, typ := range []event.Type{event.PaymentDebited, event.PaymentRejected, event.PaymentRefunded, event.StockReserved, event.StockRejected} {
			tests = append(tests, struct {
				from string
				typ  event.Type
				want string
			}{terminal, typ, terminal})
		}
	}

	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s+%s", tt.from, tt.typ), func(t *testing.T) {
			t.Parallel()
			o := place(t, svc, "transitions")
			s := saga{t, o}
			for _, ev := range reach[tt.from](s) {
				o = publishAndAwait(t, svc, o.ID, ev)
			}
			require.Equal(t, tt.from, o.Status)
			before := len(o.Timeline)

			o = publishAndAwait(t, svc, o.ID, incoming[tt.typ](s))
			require.Equal(t, tt.want, o.Status)

			// The terminal event is emitted once, when the order enters its
			// terminal state, and is in the timeline too.
			emitted := 0
			if tt.want != tt.from && terminalEvent[tt.want] != "" {
				emitted = 1
			}
			require.Len(t, o.Timeline, before+1+emitted)
			for status, typ := range terminalEvent {
				want := 0
				if status == tt.want {
					want = 1
				}
				require.Equal(t, want, outboxed(t, svc, o.ID, typ), "%s events", typ)
			}
		})
	}
}

// TestDuplicatesHaveOneEffect delivers every consumed event three times,
// the copies under fresh Nats-Msg-Ids so that only the inbox can drop them.
func TestDuplicatesHaveOneEffect(t *testing.T) {
	t.Parallel()
	svc := start(t)
	watch := map[event.Type]*apptest.Watcher{
		event.OrderConfirmed: svc.Watch(t, streams.Orders, "orders.confirmed.v1"),
		event.OrderRejected:  svc.Watch(t, streams.Orders, "orders.rejected.v1"),
		event.OrderCancelled: svc.Watch(t, streams.Orders, "orders.cancelled.v1"),
	}

	confirm, reject, cancel := saga{t, place(t, svc, "dup")}, saga{t, place(t, svc, "dup")}, saga{t, place(t, svc, "dup")}
	sequences := []struct {
		s      saga
		events []event.Envelope
		want   string
	}{
		{confirm, []event.Envelope{confirm.debited(), confirm.reserved()}, order.StatusConfirmed},
		{reject, []event.Envelope{reject.paymentRejected("insufficient funds")}, order.StatusRejected},
		{cancel, []event.Envelope{cancel.debited(), cancel.stockRejected("no pears"), cancel.refunded()}, order.StatusCancelled},
	}
	const copies = 2
	dups := map[string]int{}
	for _, seq := range sequences {
		for _, ev := range seq.events {
			publishAndAwait(t, svc, seq.s.o.ID, ev)
			for range copies {
				svc.PublishDuplicate(t, ev)
			}
			if ev.Type == event.StockReserved || ev.Type == event.StockRejected {
				dups[streams.OrderInventory] += copies
			} else {
				dups[streams.OrderPayments] += copies
			}
		}
	}
	for durable, n := range dups {
		awaitDuplicates(t, svc, durable, n)
	}

	for _, seq := range sequences {
		o := get(t, svc, seq.s.o.ID)
		require.Equal(t, seq.want, o.Status)
		// OrderPlaced, each consumed event once, the terminal event.
		require.Len(t, o.Timeline, 1+len(seq.events)+1)
		seen := map[uuid.UUID]bool{}
		for _, e := range o.Timeline {
			require.False(t, seen[e.EventID], "event %s twice in the timeline", e.EventID)
			seen[e.EventID] = true
		}
	}
	awaitOutboxSent(t, svc)
	for typ, w := range watch {
		w.Wait(t, 1)
		require.Len(t, w.Seen(), 1, "%s published once", typ)
	}
	for _, seq := range sequences {
		n := countRows(t, svc, "SELECT 1 FROM outbox WHERE subject = $1 AND event_type <> $2", seq.s.o.ID.String(), string(event.OrderPlaced))
		require.Equal(t, 1, n, "one terminal event for order %s", seq.s.o.ID)
	}
}

// TestConcurrentDuplicates delivers ten copies of each event of a saga at
// once, to several workers, so that the copies race each other in the inbox
// and the two subscriptions race for the order row.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%t", batched), func(t *testing.T) {
			t.Parallel()
			svc := start(t, func(cfg *app.Config) {
				cfg.ConsumerWorkers = 4
				cfg.ConsumerBatched = new(batched)
				cfg.ConsumerBatchSize = 4
			})
			o := place(t, svc, "racer")
			s := saga{t, o}
			debited, reserved := s.debited(), s.reserved()

			const copies = 10
			var wg sync.WaitGroup
			errs := make(chan error, 2*copies)
			for _, ev := range []event.Envelope{debited, reserved} {
				for range copies {
					wg.Go(func() { errs <- publishCopy(t.Context(), svc.JS, ev) })
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			awaitEvent(t, svc, o.ID, debited)
			awaitEvent(t, svc, o.ID, reserved)
			awaitDuplicates(t, svc, streams.OrderPayments, copies-1)
			awaitDuplicates(t, svc, streams.OrderInventory, copies-1)

			o = get(t, svc, o.ID)
			require.Equal(t, order.StatusConfirmed, o.Status)
			require.ElementsMatch(t, []event.Type{event.OrderPlaced, event.PaymentDebited, event.StockReserved, event.OrderConfirmed}, types(o.Timeline))
			require.Equal(t, 1, outboxed(t, svc, o.ID, event.OrderConfirmed))
		})
	}
}

// publishCopy publishes ev under a fresh Nats-Msg-Id; unlike
// apptest.PublishDuplicate it does not fail the test, so goroutines may call it.
func publishCopy(ctx context.Context, js jetstream.JetStream, ev event.Envelope) error {
	msg, err := ev.Msg()
	if err != nil {
		return err
	}
	msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
	_, err = js.PublishMsg(ctx, msg)
	return err
}

// TestPoisonEventsAreDeadLettered checks that events no retry can fix go to
// the DLQ at once, and that the consumer carries on after them.
func TestPoisonEventsAreDeadLettered(t *testing.T) {
	t.Parallel()
	svc := start(t)
	dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+">")
	o := place(t, svc, "poison")
	s := saga{t, o}

	unknown := saga{t, order.Order{ID: uuid.New(), CustomerID: "ghost", Items: o.Items, TotalCents: o.TotalCents}}
	wrongSubject := s.debited()
	wrongSubject.Subject = uuid.NewString()
	poison := []event.Envelope{unknown.debited(), unknown.reserved(), wrongSubject}
	for _, ev := range poison {
		svc.Publish(t, ev)
	}
	got := dlq.Wait(t, len(poison))
	ids := make([]uuid.UUID, len(got))
	for i, ev := range got {
		ids[i] = ev.ID
	}
	require.ElementsMatch(t, []uuid.UUID{poison[0].ID, poison[1].ID, poison[2].ID}, ids)

	// Both consumers still work, and the poison left no trace on the order.
	publishAndAwait(t, svc, o.ID, s.debited())
	o = publishAndAwait(t, svc, o.ID, s.reserved())
	require.Equal(t, order.StatusConfirmed, o.Status)
	require.Len(t, o.Timeline, 4)
	require.Zero(t, countRows(t, svc, "SELECT 1 FROM order_timeline WHERE order_id = $1", unknown.o.ID))
}

// TestHandlersRefuseOtherTypes calls each handler with an event it does not
// handle: a permanent error, since no retry can fix it.
func TestHandlersRefuseOtherTypes(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, order.Name)
	s := order.New(db.Pool)
	ev, err := event.New("test", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{})
	require.NoError(t, err)

	for name, h := range map[string]inbox.Handler{
		"PaymentDebited":  s.HandlePaymentDebited,
		"PaymentRejected": s.HandlePaymentRejected,
		"PaymentRefunded": s.HandlePaymentRefunded,
		"StockReserved":   s.HandleStockReserved,
		"StockRejected":   s.HandleStockRejected,
	} {
		tx, err := db.Pool.Begin(t.Context())
		require.NoError(t, err)
		err = h(t.Context(), tx, ev)
		require.NoError(t, tx.Rollback(t.Context()))
		require.True(t, errors.Is(err, inbox.ErrPermanent), "%s: got %v", name, err)
	}
}

// TestSecondOutcomeForAnOrderEmitsOneTerminalEvent delivers, for each way an
// order ends, a second event of the kind that ends it under another event
// id, which the inbox cannot tell apart: the order's status, not the inbox,
// makes its terminal event once. The events go at once, so that batched
// consumers may take them together.
func TestSecondOutcomeForAnOrderEmitsOneTerminalEvent(t *testing.T) {
	t.Parallel()
	apptest.EachConsumerMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		s := seedOrders(t, 4, svc.DB.Pool)
		confirmed, rejected, refusedTwice, refundedTwice := s[0], s[1], s[2], s[3]
		reserved, paymentRejected, refund := confirmed.reserved(), rejected.paymentRejected("insufficient funds"), refundedTwice.refunded()
		payments := []event.Envelope{
			confirmed.debited(),
			paymentRejected, reemitted(paymentRejected),
			refusedTwice.debited(), refusedTwice.refunded(),
			refundedTwice.debited(), refund, reemitted(refund),
		}
		inventory := []event.Envelope{
			reserved, reemitted(reserved),
			refusedTwice.stockRejected("no pears"), refusedTwice.stockRejected("no apples"),
			refundedTwice.stockRejected("no pears"),
		}
		publishAtOnce(t, svc, payments, nil)
		publishAtOnce(t, svc, inventory, nil)
		awaitConsumed(t, svc, streams.OrderPayments, len(payments))
		awaitConsumed(t, svc, streams.OrderInventory, len(inventory))

		for _, tt := range []struct {
			s    saga
			want string
			typ  event.Type
		}{
			{confirmed, order.StatusConfirmed, event.OrderConfirmed},
			{rejected, order.StatusRejected, event.OrderRejected},
			{refusedTwice, order.StatusCancelled, event.OrderCancelled},
			{refundedTwice, order.StatusCancelled, event.OrderCancelled},
		} {
			require.Equal(t, tt.want, get(t, svc, tt.s.o.ID).Status, "order %s", tt.s.o.ID)
			for _, typ := range []event.Type{event.OrderConfirmed, event.OrderRejected, event.OrderCancelled} {
				want := 0
				if typ == tt.typ {
					want = 1
				}
				require.Equal(t, want, outboxed(t, svc, tt.s.o.ID, typ), "%s events of order %s", typ, tt.s.o.ID)
			}
		}
		require.Zero(t, svc.InboxCount(t, streams.OrderPayments, "dead_lettered")+svc.InboxCount(t, streams.OrderInventory, "dead_lettered"))
	})
}

// TestHandlersWriteOnlyInTheirTransaction runs each handler on a pending
// order in a transaction that is then rolled back: its order, timeline and
// outbox writes roll back with it.
func TestHandlersWriteOnlyInTheirTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, order.Name)
	s := order.New(db.Pool)
	o := seedOrders(t, 5, db.Pool)

	apptest.RequireRollsBack(t, db.Pool,
		apptest.Handled{Name: "PaymentDebited", Handle: s.HandlePaymentDebited, Event: o[0].debited()},
		apptest.Handled{Name: "PaymentRejected", Handle: s.HandlePaymentRejected, Event: o[1].paymentRejected("insufficient funds")},
		apptest.Handled{Name: "PaymentRefunded", Handle: s.HandlePaymentRefunded, Event: o[2].refunded()},
		apptest.Handled{Name: "StockReserved", Handle: s.HandleStockReserved, Event: o[3].reserved()},
		apptest.Handled{Name: "StockRejected", Handle: s.HandleStockRejected, Event: o[4].stockRejected("no pears")},
	)
}

package order_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
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

// eventNames are the event types by the names docs/saga.md gives them.
var eventNames = map[string]event.Type{
	"OrderPlaced": event.OrderPlaced, "OrderConfirmed": event.OrderConfirmed,
	"OrderRejected": event.OrderRejected, "OrderCancelled": event.OrderCancelled,
	"OrderExpired": event.OrderExpired, "PaymentDebited": event.PaymentDebited,
	"PaymentRejected": event.PaymentRejected, "PaymentRefunded": event.PaymentRefunded,
	"StockReserved": event.StockReserved, "StockRejected": event.StockRejected,
}

var (
	// "payment (`payment-orders`)": a service and its durable.
	serviceDurable = regexp.MustCompile("^([a-z]+) \\(`([a-z]+-[a-z]+)`\\)")
	// "PENDING or PAID → CONFIRMED".
	transition = regexp.MustCompile(`([A-Z]+(?: or [A-Z]+)*) → ([A-Z]+)`)
	// "REJECTED, `OrderRejected` (order, `order-payments`)".
	becomes  = regexp.MustCompile("^([A-Z]+), `[A-Za-z]+` \\(order, `([a-z]+-[a-z]+)`\\)")
	codeName = regexp.MustCompile("`([A-Za-z-]+)`")
)

// TestTheSagaDocIsTheRules reads docs/saga.md's tables as the rules they
// state and checks them against the code: each durable named is the
// topology's, of that service, filtering the event the table says it
// hears; each transition is NextStatus's; each late reply's fate is
// LateFate's, and the late table has one fate for every terminal status
// and every reply the order service hears. The event types and subjects
// it quotes are the code's too.
func TestTheSagaDocIsTheRules(t *testing.T) {
	t.Parallel()
	require.Len(t, eventNames, len(event.Types()), "eventNames misses an event type")
	raw, err := os.ReadFile("../../docs/saga.md")
	require.NoError(t, err)
	doc := string(raw)
	topo := streams.Saga(streams.Config{})
	hears := func(service, durable string, typ event.Type) {
		t.Helper()
		subject, err := typ.NATSSubject()
		require.NoError(t, err)
		i := slices.IndexFunc(topo.Consumers, func(c streams.Consumer) bool { return c.Durable == durable })
		require.GreaterOrEqual(t, i, 0, "docs/saga.md: %s is no durable of the topology", durable)
		require.Equal(t, service, topo.Consumers[i].Service, "docs/saga.md: the service of %s", durable)
		require.Contains(t, topo.Consumers[i].FilterSubjects, subject, "docs/saga.md: %s does not hear %s", durable, typ)
	}

	var transitions int
	for _, row := range table(t, doc, "| step | service (durable) | on |") {
		m := serviceDurable.FindStringSubmatch(row[1])
		if m == nil {
			continue // placed by a request, not an event
		}
		typ := named(t, row[2])
		hears(m[1], m[2], typ)
		for _, m := range transition.FindAllStringSubmatch(row[3], -1) {
			for _, from := range strings.Split(m[1], " or ") {
				to, ok := order.NextStatus(from, typ)
				require.True(t, ok && to == m[2], "docs/saga.md: %s → %s on %s; NextStatus says %q", from, m[2], typ, to)
				transitions++
			}
		}
	}
	for _, row := range table(t, doc, "| when | service (durable) | writes | emits | order becomes |") {
		emitted := named(t, row[3])
		switch m := becomes.FindStringSubmatch(row[4]); {
		case m != nil:
			hears("order", m[2], emitted)
			to, ok := order.NextStatus(order.StatusPending, emitted)
			require.True(t, ok && to == m[1], "docs/saga.md: %s makes an order %s; NextStatus says %q", emitted, m[1], to)
			transitions++
		case strings.HasPrefix(row[4], "—"):
			for _, s := range statuses() {
				_, ok := order.NextStatus(s, emitted)
				require.False(t, ok, "docs/saga.md: %s moves no order, but NextStatus moves a %s one", emitted, s)
			}
		}
	}
	require.Positive(t, transitions, "docs/saga.md: no transition was read")
	for _, row := range table(t, doc, "| participant | durable | on `OrderExpired` |") {
		hears(row[0], codeName.FindStringSubmatch(row[1])[1], event.OrderExpired)
	}
	checkLateFates(t, doc, topo)
	checkTypesAndSubjects(t, doc)
}

// checkTypesAndSubjects checks each event type (`onceflow.order.expired.v1`)
// and each subject (`orders.expired.v1`) docs/saga.md quotes.
func checkTypesAndSubjects(t *testing.T, doc string) {
	t.Helper()
	subjects := map[string]bool{}
	for _, typ := range event.Types() {
		subject, err := typ.NATSSubject()
		require.NoError(t, err)
		subjects[subject] = true
	}
	quoted := regexp.MustCompile("`((onceflow\\.)?[a-z]+\\.[a-z]+\\.v[0-9]+)`").FindAllStringSubmatch(doc, -1)
	require.NotEmpty(t, quoted, "docs/saga.md quotes no event type or subject")
	for _, m := range quoted {
		if m[2] != "" {
			require.Contains(t, event.Types(), event.Type(m[1]), "docs/saga.md: %s is no event type", m[1])
		} else {
			require.True(t, subjects[m[1]], "docs/saga.md: %s is no event's subject", m[1])
		}
	}
}

// checkLateFates checks the late table against LateFate, and that it gives
// one fate for every terminal status and every reply the order hears.
func checkLateFates(t *testing.T, doc string, topo streams.Topology) {
	t.Helper()
	var replies []event.Type
	for _, c := range topo.Consumers {
		if c.Service != "order" {
			continue
		}
		for _, typ := range event.Types() {
			if subject, _ := typ.NATSSubject(); slices.Contains(c.FilterSubjects, subject) {
				replies = append(replies, typ)
			}
		}
	}
	given := map[string]bool{}
	for _, row := range table(t, doc, "| reply | order is | fate (`late`) |") {
		types := replies
		if row[0] != "any reply" {
			types = []event.Type{named(t, row[0])}
		}
		fate := codeName.FindStringSubmatch(row[2])[1]
		for _, s := range strings.Split(row[1], ", ") {
			for _, typ := range types {
				key := s + " " + string(typ)
				require.False(t, given[key], "docs/saga.md: two fates for %s", key)
				given[key] = true
				require.Equal(t, order.LateFate(s, typ), fate, "docs/saga.md: the fate of %s to a %s order", typ, s)
			}
		}
	}
	for _, s := range statuses() {
		for _, typ := range replies {
			if order.Terminal(s) {
				require.True(t, given[s+" "+string(typ)], "docs/saga.md gives no fate for %s to a %s order", typ, s)
			}
		}
	}
}

func statuses() []string {
	return []string{order.StatusPending, order.StatusPaid, order.StatusConfirmed, order.StatusRejected, order.StatusCancelled, order.StatusExpired}
}

// named is the event type a table cell names first (`PaymentDebited`).
func named(t *testing.T, cell string) event.Type {
	t.Helper()
	m := codeName.FindStringSubmatch(cell)
	require.NotNil(t, m, "docs/saga.md: %q names no event", cell)
	typ, ok := eventNames[m[1]]
	require.True(t, ok, "docs/saga.md: %q is no event type", m[1])
	return typ
}

// table is the body of the Markdown table of doc whose header row starts
// with header: each row's cells, trimmed.
func table(t *testing.T, doc, header string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+header)
	require.True(t, ok, "docs/saga.md has no table %q", header)
	var rows [][]string
	for _, line := range strings.Split(rest, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	require.NotEmpty(t, rows, "docs/saga.md: the table %q has no row", header)
	return rows
}

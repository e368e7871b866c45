package notify_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/notify"
)

// start runs the service with a recording sender and a short mailer poll
// interval; configure adjusts the configuration further.
func start(t *testing.T, configure ...func(*notify.Config)) (*apptest.Service, *recorder) {
	t.Helper()
	rec := &recorder{}
	svc := apptest.Start(t, notify.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
		c := notify.Config{Config: cfg, Sender: rec, MailerPollInterval: 20 * time.Millisecond}
		for _, f := range configure {
			f(&c)
		}
		return notify.Run(ctx, c, l)
	})
	return svc, rec
}

// recorder is a Sender that records what it is given. fail, when set, is
// asked on each call (numbered from 1) whether that call fails.
type recorder struct {
	mu    sync.Mutex
	calls []notify.Message
	sent  []notify.Message
	fail  func(call int) error
}

func (r *recorder) FailWith(fail func(call int) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = fail
}

func (r *recorder) Send(_ context.Context, m notify.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, m)
	if r.fail != nil {
		if err := r.fail(len(r.calls)); err != nil {
			return err
		}
	}
	r.sent = append(r.sent, m)
	return nil
}

func (r *recorder) Calls() []notify.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]notify.Message(nil), r.calls...)
}

func (r *recorder) Sent() []notify.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]notify.Message(nil), r.sent...)
}

func orderPlaced(t testing.TB, customer, email string) event.Envelope {
	t.Helper()
	orderID := uuid.Must(uuid.NewV7())
	ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: customer, CustomerEmail: email},
		Lines:      event.Lines{{SKU: "apple", Quantity: 3, UnitPriceCents: 125}},
		TotalCents: 375,
	})
	require.NoError(t, err)
	return ev
}

// milestone is the order event of type typ that follows placed.
func milestone(t testing.TB, placed event.Envelope, typ event.Type) event.Envelope {
	t.Helper()
	if typ == event.OrderPlaced {
		return placed
	}
	var p event.OrderPlacedV1
	require.NoError(t, placed.Decode(&p))
	var payload any
	switch typ {
	case event.OrderConfirmed:
		payload = event.OrderConfirmedV1{Order: p.Order, TotalCents: p.TotalCents}
	case event.OrderRejected:
		payload = event.OrderRejectedV1{Order: p.Order, Reason: "insufficient funds"}
	case event.OrderCancelled:
		payload = event.OrderCancelledV1{Order: p.Order, Reason: "out of apple"}
	case event.OrderExpired:
		payload = event.OrderExpiredV1{Order: p.Order, Deadline: time.Now().UTC(), Status: "PAID", TotalCents: p.TotalCents}
	default:
		t.Fatalf("no milestone %s", typ)
	}
	ev, err := placed.Caused("order", typ, payload)
	require.NoError(t, err)
	return ev
}

func orderID(t *testing.T, ev event.Envelope) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(ev.Subject)
	require.NoError(t, err)
	return id
}

// requireProcessed waits until the notify-orders durable has acknowledged
// the first n messages of the ORDERS stream.
func requireProcessed(t *testing.T, svc *apptest.Service, n uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		cons, err := svc.JS.Consumer(t.Context(), streams.Orders, streams.NotifyOrders)
		if err != nil {
			return false
		}
		info, err := cons.Info(t.Context())
		return err == nil && info.AckFloor.Stream >= n && info.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond)
}

// row is a notification as stored.
type row struct {
	Kind, Recipient, Status, MessageID, Subject, Body, LastError string
	EventID                                                      uuid.UUID
	Attempts                                                     int
	CreatedAt                                                    time.Time
	SentAt                                                       *time.Time
}

func rows(t *testing.T, pool *pgxpool.Pool, orderID uuid.UUID) []row {
	t.Helper()
	out, err := queryRows(t.Context(), pool, orderID)
	require.NoError(t, err)
	return out
}

func queryRows(ctx context.Context, pool *pgxpool.Pool, orderID uuid.UUID) ([]row, error) {
	r, err := pool.Query(ctx, `
		SELECT kind, recipient, status, message_id, subject, body, last_error, event_id, attempts, created_at, sent_at
		FROM notifications WHERE order_id = $1 ORDER BY id`, orderID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowToStructByPos[row])
}

// awaitSettled waits until the order's only notification has left PENDING
// and returns it.
func awaitSettled(t *testing.T, pool *pgxpool.Pool, orderID uuid.UUID) row {
	t.Helper()
	var n row
	require.Eventually(t, func() bool {
		got, err := queryRows(t.Context(), pool, orderID)
		if err != nil || len(got) != 1 {
			return false
		}
		n = got[0]
		return n.Status != notify.StatusPending
	}, 20*time.Second, 10*time.Millisecond)
	return n
}

func countNotifications(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM notifications`).Scan(&n))
	return n
}

func TestEachMilestoneWritesOneNotification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		typ        event.Type
		kind       string
		subject    string
		deliveries int
	}{
		{event.OrderPlaced, notify.KindPlaced, "We received your order", 1},
		{event.OrderPlaced, notify.KindPlaced, "We received your order", 5},
		{event.OrderConfirmed, notify.KindConfirmed, "is confirmed", 1},
		{event.OrderConfirmed, notify.KindConfirmed, "is confirmed", 5},
		{event.OrderRejected, notify.KindRejected, "was rejected", 1},
		{event.OrderRejected, notify.KindRejected, "was rejected", 5},
		{event.OrderCancelled, notify.KindCancelled, "was cancelled", 1},
		{event.OrderCancelled, notify.KindCancelled, "was cancelled", 5},
		{event.OrderExpired, notify.KindExpired, "could not be completed in time", 1},
		{event.OrderExpired, notify.KindExpired, "could not be completed in time", 5},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d deliveries", tt.kind, tt.deliveries), func(t *testing.T) {
			t.Parallel()
			svc, rec := start(t)
			ev := milestone(t, orderPlaced(t, "alice", "alice@shop.example"), tt.typ)
			svc.Publish(t, ev)
			for range tt.deliveries - 1 {
				svc.PublishDuplicate(t, ev)
			}
			requireProcessed(t, svc, uint64(tt.deliveries))

			id := orderID(t, ev)
			got := rows(t, svc.DB.Pool, id)
			require.Len(t, got, 1, "one notification per (order, milestone), whatever the deliveries")
			n := got[0]
			require.Equal(t, tt.kind, n.Kind)
			require.Equal(t, "alice@shop.example", n.Recipient)
			require.Equal(t, ev.ID, n.EventID)
			require.Equal(t, "<"+ev.ID.String()+"@onceflow>", n.MessageID)
			require.Contains(t, n.Subject, tt.subject)
			require.Contains(t, n.Subject, id.String())
			require.Contains(t, n.Body, id.String())

			require.Eventually(t, func() bool { return len(rec.Sent()) == 1 }, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, n.MessageID, rec.Sent()[0].ID)
		})
	}
}

func TestMilestoneBodies(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	placed := orderPlaced(t, "bea", "")
	for _, typ := range []event.Type{event.OrderPlaced, event.OrderRejected, event.OrderCancelled} {
		svc.Publish(t, milestone(t, placed, typ))
	}
	requireProcessed(t, svc, 3)
	got := rows(t, svc.DB.Pool, orderID(t, placed))
	require.Len(t, got, 3)
	require.Contains(t, got[0].Body, "total 3.75")
	require.Contains(t, got[1].Body, "insufficient funds")
	require.Contains(t, got[1].Body, "Nothing was charged")
	require.Contains(t, got[2].Body, "out of apple")
	require.Contains(t, got[2].Body, "refunded")
}

func TestSagaPathsWriteOneNotificationPerMilestone(t *testing.T) {
	t.Parallel()
	paths := map[string][]event.Type{
		"confirmed": {event.OrderPlaced, event.OrderConfirmed},
		"rejected":  {event.OrderPlaced, event.OrderRejected},
		"cancelled": {event.OrderPlaced, event.OrderCancelled},
		// A replay can deliver the terminal event before the placement:
		// each milestone has its own row, so the order does not matter.
		"out of order": {event.OrderConfirmed, event.OrderPlaced},
	}
	for name, path := range paths {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc, rec := start(t)
			placed := orderPlaced(t, "carl", "carl@shop.example")
			wantKinds := make([]string, len(path))
			for i, typ := range path {
				ev := milestone(t, placed, typ)
				svc.Publish(t, ev)
				svc.PublishDuplicate(t, ev)
				wantKinds[i] = kindOf(typ)
			}
			requireProcessed(t, svc, uint64(2*len(path)))

			got := rows(t, svc.DB.Pool, orderID(t, placed))
			kinds := make([]string, len(got))
			for i, n := range got {
				kinds[i] = n.Kind
			}
			require.Equal(t, wantKinds, kinds)
			require.Eventually(t, func() bool { return len(rec.Sent()) == len(path) }, 10*time.Second, 10*time.Millisecond)
		})
	}
}

func kindOf(typ event.Type) string {
	return map[event.Type]string{
		event.OrderPlaced:    notify.KindPlaced,
		event.OrderConfirmed: notify.KindConfirmed,
		event.OrderRejected:  notify.KindRejected,
		event.OrderCancelled: notify.KindCancelled,
		event.OrderExpired:   notify.KindExpired,
	}[typ]
}

func TestConcurrentDuplicatesWriteAndSendOne(t *testing.T) {
	t.Parallel()
	svc, rec := start(t)
	ev := orderPlaced(t, "dina", "dina@shop.example")
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { svc.PublishDuplicate(t, ev) })
	}
	wg.Wait()
	requireProcessed(t, svc, 10)

	got := rows(t, svc.DB.Pool, orderID(t, ev))
	require.Len(t, got, 1)
	require.Equal(t, notify.StatusSent, awaitSettled(t, svc.DB.Pool, orderID(t, ev)).Status)
	require.Len(t, rec.Calls(), 1, "one e-mail from ten deliveries")
}

func TestMilestoneReemittedUnderNewIDWritesNothing(t *testing.T) {
	t.Parallel()
	svc, rec := start(t)
	placed := orderPlaced(t, "emil", "emil@shop.example")
	first := milestone(t, placed, event.OrderConfirmed)
	again := milestone(t, placed, event.OrderConfirmed) // same milestone, new event id
	require.NotEqual(t, first.ID, again.ID)
	svc.Publish(t, first)
	svc.Publish(t, again)
	requireProcessed(t, svc, 2)

	got := rows(t, svc.DB.Pool, orderID(t, placed))
	require.Len(t, got, 1)
	require.Equal(t, first.ID, got[0].EventID)
	require.Eventually(t, func() bool { return len(rec.Sent()) == 1 }, 10*time.Second, 10*time.Millisecond)
}

func TestRecipient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, customer, email string
		wantRecipient, status string
	}{
		{"customer e-mail", "fay", "fay@shop.example", "fay@shop.example", notify.StatusSent},
		{"display name is dropped", "fay", "Fay <fay@shop.example>", "fay@shop.example", notify.StatusSent},
		{"no e-mail: RFC 2606 placeholder", "fay-42", "", "fay-42@example.invalid", notify.StatusSent},
		{"unparsable e-mail fails at once", "fay", "not an address", "not an address", notify.StatusFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, rec := start(t)
			ev := orderPlaced(t, tt.customer, tt.email)
			svc.Publish(t, ev)
			requireProcessed(t, svc, 1)
			n := awaitSettled(t, svc.DB.Pool, orderID(t, ev))
			require.Equal(t, tt.wantRecipient, n.Recipient)
			require.Equal(t, tt.status, n.Status)
			if tt.status == notify.StatusFailed {
				require.Contains(t, n.LastError, "invalid recipient")
				require.Empty(t, rec.Calls(), "an invalid address is never handed to the sender")
				return
			}
			require.Equal(t, tt.wantRecipient, rec.Sent()[0].To)
		})
	}
}

func TestInvalidMilestoneIsDeadLettered(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	id := uuid.Must(uuid.NewV7())
	// The total does not match the lines: no retry can make it valid.
	bad, err := event.New("order", event.OrderPlaced, id.String(), map[string]any{
		"order_id": id, "customer_id": "gus",
		"lines":       []map[string]any{{"sku": "apple", "quantity": 1, "unit_price_cents": 5}},
		"total_cents": 6,
	})
	require.NoError(t, err)
	svc.Publish(t, bad)
	good := orderPlaced(t, "gus", "")
	svc.Publish(t, good)
	requireProcessed(t, svc, 2)

	dlq, err := svc.JS.Stream(t.Context(), streams.DLQ)
	require.NoError(t, err)
	info, err := dlq.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs)
	require.Empty(t, rows(t, svc.DB.Pool, id))
	require.Len(t, rows(t, svc.DB.Pool, orderID(t, good)), 1, "one bad message does not stop the consumer")
}

func TestHandlersRefuseOtherEventTypes(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	s := notify.New(svc.DB.Pool)
	placed := orderPlaced(t, "hal", "")
	confirmed := milestone(t, placed, event.OrderConfirmed)
	debited, err := placed.Caused("payment", event.PaymentDebited, event.PaymentDebitedV1{})
	require.NoError(t, err)
	tests := []struct {
		name    string
		handler func(context.Context, pgx.Tx, event.Envelope) error
		ev      event.Envelope
	}{
		{"placed handler", s.HandleOrderPlaced, confirmed},
		{"confirmed handler", s.HandleOrderConfirmed, placed},
		{"rejected handler", s.HandleOrderRejected, placed},
		{"cancelled handler", s.HandleOrderCancelled, placed},
		{"milestone dispatcher", s.HandleOrderMilestone, debited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, err := svc.DB.Pool.Begin(t.Context())
			require.NoError(t, err)
			defer func() { require.NoError(t, tx.Rollback(t.Context())) }()
			err = tt.handler(t.Context(), tx, tt.ev)
			require.True(t, errors.Is(err, inbox.ErrPermanent), "got %v", err)
		})
	}
	require.Zero(t, countNotifications(t, svc.DB.Pool))
}

// TestHandlersWriteOnlyInTheirTransaction runs each handler in a
// transaction that is then rolled back: its notification rolls back with
// it.
func TestHandlersWriteOnlyInTheirTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, notify.Name)
	s := notify.New(db.Pool)
	placed := orderPlaced(t, "lou", "lou@shop.example")

	apptest.RequireRollsBack(t, db.Pool,
		apptest.Handled{Name: "OrderMilestone", Handle: s.HandleOrderMilestone, Event: placed},
		apptest.Handled{Name: "OrderPlaced", Handle: s.HandleOrderPlaced, Event: placed},
		apptest.Handled{Name: "OrderConfirmed", Handle: s.HandleOrderConfirmed, Event: milestone(t, placed, event.OrderConfirmed)},
		apptest.Handled{Name: "OrderRejected", Handle: s.HandleOrderRejected, Event: milestone(t, placed, event.OrderRejected)},
		apptest.Handled{Name: "OrderCancelled", Handle: s.HandleOrderCancelled, Event: milestone(t, placed, event.OrderCancelled)},
	)
}

package order_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/services/order"
)

// start runs the order service for one test.
func start(t *testing.T, configure ...func(*app.Config)) *apptest.Service {
	t.Helper()
	return startOrder(t, order.Config{}, configure...)
}

// startOrder runs the order service with the settings of its own in base,
// its catalog priced as testPrices says.
func startOrder(t *testing.T, base order.Config, configure ...func(*app.Config)) *apptest.Service {
	t.Helper()
	svc := apptest.Start(t, order.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
		base.Config = cfg
		return order.Run(ctx, base, l)
	}, configure...)
	for sku, cents := range testPrices() {
		resp := svc.Do(t, http.MethodPut, "/products/"+sku, svc.AsAdmin(t), map[string]any{"unit_price_cents": cents}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	return svc
}

// testPrices is the catalog of the tests' orders.
func testPrices() map[string]int64 { return map[string]int64{"apple": 250, "pear": 1000} }

// place places an order of two lines (total 2×250 + 1×1000 = 1500) for
// customer through the API and returns it.
func place(t *testing.T, svc *apptest.Service, customer string) order.Order {
	t.Helper()
	var o order.Order
	resp := svc.Do(t, http.MethodPost, "/orders", svc.As(t, customer, key(uuid.NewString())), map[string]any{
		"customer_email": customer + "@example.com",
		"items": []map[string]any{
			{"sku": "apple", "quantity": 2},
			{"sku": "pear", "quantity": 1},
		},
	}, &o)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, order.StatusPending, o.Status)
	return o
}

func key(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }

// authorize gives req a token for r, without failing the test, for the
// helpers that goroutines call.
func authorize(req *http.Request, svc *apptest.Service, r auth.TokenRequest) error {
	tok, err := svc.Issuer.Token(r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return nil
}

// saga builds the events the other services would send about o.
type saga struct {
	t *testing.T
	o order.Order
}

func (s saga) ref() event.Order {
	return event.Order{OrderID: s.o.ID, CustomerID: s.o.CustomerID, CustomerEmail: s.o.CustomerEmail}
}

func (s saga) lines() event.Lines {
	lines := make(event.Lines, len(s.o.Items))
	for i, it := range s.o.Items {
		lines[i] = event.OrderLine{SKU: it.SKU, Quantity: it.Quantity, UnitPriceCents: it.UnitPriceCents}
	}
	return lines
}

func (s saga) event(source string, typ event.Type, payload any) event.Envelope {
	s.t.Helper()
	ev, err := event.New(source, typ, s.o.ID.String(), payload)
	require.NoError(s.t, err)
	return ev
}

func (s saga) debited() event.Envelope {
	return s.event("payment", event.PaymentDebited, event.PaymentDebitedV1{Order: s.ref(), Lines: s.lines(), AmountCents: s.o.TotalCents})
}

func (s saga) paymentRejected(reason string) event.Envelope {
	return s.event("payment", event.PaymentRejected, event.PaymentRejectedV1{Order: s.ref(), AmountCents: s.o.TotalCents, Reason: reason})
}

func (s saga) refunded() event.Envelope {
	return s.event("payment", event.PaymentRefunded, event.PaymentRefundedV1{Order: s.ref(), AmountCents: s.o.TotalCents})
}

func (s saga) reserved() event.Envelope {
	return s.event("inventory", event.StockReserved, event.StockReservedV1{Order: s.ref(), Lines: s.lines()})
}

func (s saga) stockRejected(reason string) event.Envelope {
	return s.event("inventory", event.StockRejected, event.StockRejectedV1{Order: s.ref(), AmountCents: s.o.TotalCents, Reason: reason})
}

// get reads an order through the API.
func get(t *testing.T, svc *apptest.Service, id uuid.UUID) order.Order {
	t.Helper()
	var o order.Order
	resp := svc.Do(t, http.MethodGet, "/orders/"+id.String(), svc.AsAdmin(t), nil, &o)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return o
}

// fetch reads an order through the API without failing the test, for the
// conditions of require.Eventually, which run on another goroutine.
func fetch(ctx context.Context, svc *apptest.Service, id uuid.UUID) (order.Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, svc.BaseURL+"/orders/"+id.String(), nil)
	if err != nil {
		return order.Order{}, err
	}
	if err := authorize(req, svc, auth.TokenRequest{Subject: "operator", Admin: true}); err != nil {
		return order.Order{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return order.Order{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return order.Order{}, fmt.Errorf("GET order %s: %s", id, resp.Status)
	}
	var o order.Order
	return o, json.NewDecoder(resp.Body).Decode(&o)
}

// awaitEvent waits until the order's timeline shows ev, which means it was
// processed (every handled event is recorded there), and returns the order.
func awaitEvent(t *testing.T, svc *apptest.Service, id uuid.UUID, ev event.Envelope) order.Order {
	t.Helper()
	var o order.Order
	require.Eventually(t, func() bool {
		got, err := fetch(t.Context(), svc, id)
		if err != nil || !slices.ContainsFunc(got.Timeline, func(e order.TimelineEntry) bool { return e.EventID == ev.ID }) {
			return false
		}
		o = got
		return true
	}, 20*time.Second, 20*time.Millisecond, "%s %s never reached order %s", ev.Type, ev.ID, id)
	return o
}

// publishAndAwait publishes ev and waits until it was processed.
func publishAndAwait(t *testing.T, svc *apptest.Service, id uuid.UUID, ev event.Envelope) order.Order {
	t.Helper()
	svc.Publish(t, ev)
	return awaitEvent(t, svc, id, ev)
}

// types lists the types of a timeline, in order.
func types(timeline []order.TimelineEntry) []event.Type {
	out := make([]event.Type, len(timeline))
	for i, e := range timeline {
		out[i] = e.Type
	}
	return out
}

// countRows counts the rows of a query's result.
func countRows(t *testing.T, svc *apptest.Service, query string, args ...any) int {
	t.Helper()
	n, err := count(t.Context(), svc, query, args...)
	require.NoError(t, err)
	return n
}

func count(ctx context.Context, svc *apptest.Service, query string, args ...any) (int, error) {
	var n int
	err := svc.DB.Pool.QueryRow(ctx, "SELECT count(*) FROM ("+query+") AS q", args...).Scan(&n)
	return n, err
}

// outboxed counts the outbox rows of type typ about order id.
func outboxed(t *testing.T, svc *apptest.Service, id uuid.UUID, typ event.Type) int {
	t.Helper()
	return countRows(t, svc, "SELECT 1 FROM outbox WHERE subject = $1 AND event_type = $2", id.String(), string(typ))
}

// awaitDuplicates waits until the consumer durable dropped at least n
// duplicates.
func awaitDuplicates(t *testing.T, svc *apptest.Service, durable string, n int) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.GreaterOrEqual(c, svc.InboxCount(c, durable, "duplicate"), n)
	}, 20*time.Second, 20*time.Millisecond, "%s did not drop %d duplicates", durable, n)
}

// awaitOutboxSent waits until the relay published every outbox row.
func awaitOutboxSent(t *testing.T, svc *apptest.Service) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := count(t.Context(), svc, "SELECT 1 FROM outbox_unsent")
		return err == nil && n == 0
	}, 20*time.Second, 20*time.Millisecond, "the outbox was not published")
}

package order_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/order"
)

func TestCatalogIsAnOperatorsToWriteAndAnyonesToRead(t *testing.T) {
	t.Parallel()
	svc := start(t)

	var p order.Product
	resp := svc.Do(t, http.MethodPut, "/products/plum", svc.AsAdmin(t), map[string]any{"name": "Plum", "unit_price_cents": 500}, &p)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "Plum", p.Name)
	require.Equal(t, int64(500), p.UnitPriceCents)

	// The reads need no token.
	resp = svc.Do(t, http.MethodGet, "/products/plum", nil, nil, &p)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int64(500), p.UnitPriceCents)
	var pages []string
	next := ""
	for range 4 {
		var list order.ProductList
		resp = svc.Do(t, http.MethodGet, "/products?limit=2&next="+next, nil, nil, &list)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		for _, p := range list.Products {
			pages = append(pages, p.SKU)
		}
		if next = list.Next; next == "" {
			break
		}
	}
	require.Equal(t, []string{"apple", "pear", "plum"}, pages, "every product once, in SKU order")
	var problem json.RawMessage
	resp = svc.Do(t, http.MethodGet, "/products/kiwi", nil, nil, &problem)
	requireProblem(t, resp, problem, http.StatusNotFound)

	// A customer cannot set a price; nobody can without a token.
	resp = svc.Do(t, http.MethodPut, "/products/plum", svc.As(t, "alice"), map[string]any{"unit_price_cents": 1}, &problem)
	requireProblem(t, resp, problem, http.StatusForbidden)
	resp = svc.Do(t, http.MethodPut, "/products/plum", nil, map[string]any{"unit_price_cents": 1}, &problem)
	requireProblem(t, resp, problem, http.StatusUnauthorized)
	for _, body := range []string{
		`{"unit_price_cents":0}`, `{"unit_price_cents":-1}`, `{"name":"x"}`, `{"unit_price_cents":1000000001}`,
		`{"unit_price_cents":1,"unit_price_cents":500}`, `{"Unit_Price_Cents":1}`,
		`{"name":"` + strings.Repeat("n", 201) + `","unit_price_cents":1}`,
	} {
		resp = svc.Do(t, http.MethodPut, "/products/plum", svc.AsAdmin(t), json.RawMessage(body), &problem)
		requireProblem(t, resp, problem, http.StatusBadRequest)
	}
	resp = svc.Do(t, http.MethodGet, "/products/plum", nil, nil, &p)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int64(500), p.UnitPriceCents, "no refused PUT changed the price")
}

func TestOrdersArePricedFromTheCatalog(t *testing.T) {
	t.Parallel()
	svc := start(t)
	placedEvents := svc.Watch(t, streams.Orders, "orders.placed.v1")

	first := place(t, svc, "alice") // 2 apples at 250, 1 pear at 1000
	require.Equal(t, int64(1500), first.TotalCents)

	// The service read apple's price for the first order, and guesses 250
	// for the next: the guess's check in the order's transaction fails,
	// and the order is placed again at the price read.
	resp := svc.Do(t, http.MethodPut, "/products/apple", svc.AsAdmin(t), map[string]any{"unit_price_cents": 300}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	second := place(t, svc, "alice")
	require.Equal(t, int64(2*300+1000), second.TotalCents, "the price at the time of the order")
	require.Equal(t, int64(1500), get(t, svc, first.ID).TotalCents, "an order keeps the price it was placed at")

	// The events carry the priced lines, so payment and inventory need no
	// catalog.
	for i, ev := range placedEvents.Wait(t, 2) {
		var p event.OrderPlacedV1
		require.NoError(t, ev.Decode(&p))
		want := []order.Order{first, second}[i]
		require.Equal(t, want.TotalCents, p.TotalCents)
		for j, l := range p.Lines {
			require.Equal(t, want.Items[j].UnitPriceCents, l.UnitPriceCents)
		}
	}

	var problem json.RawMessage
	resp = svc.Do(t, http.MethodPost, "/orders", svc.As(t, "alice", key("unknown-sku")),
		json.RawMessage(`{"items":[{"sku":"apple","quantity":1},{"sku":"kiwi","quantity":1}]}`), &problem)
	requireProblem(t, resp, problem, http.StatusUnprocessableEntity)
	require.Contains(t, string(problem), `\"kiwi\"`, "the problem names the SKU")
	require.Equal(t, 2, countRows(t, svc, "SELECT 1 FROM orders"))
	require.Zero(t, countRows(t, svc, "SELECT 1 FROM idempotency_keys WHERE key = 'unknown-sku'"), "a refused order keeps no key")
}

// Nothing malformed in a query or a body reaches PostgreSQL: a cursor, an
// id or a text it could not store is a 400 problem, never a 500, from an
// anonymous caller as from anyone.
func TestMalformedInputIsABadRequest(t *testing.T) {
	t.Parallel()
	svc := start(t)
	cursorOf := func(micros uint64) string {
		b := binary.BigEndian.AppendUint64(nil, micros)
		return base64.RawURLEncoding.EncodeToString(append(b, make([]byte, 16)...))
	}
	for _, tc := range []struct {
		path   string
		header http.Header
	}{
		{path: "/products?next=%00"},
		{path: "/products?next=%ff"},
		{path: "/products?next=a%00b"},
		{path: "/products?next=%c3%28"},
		{path: "/products?next=" + strings.Repeat("a", 129)},
		{path: "/products?next=two%20words"},
		{path: "/orders?next=%00", header: svc.As(t, "alice")},
		{path: "/orders?next=%ff", header: svc.As(t, "alice")},
		{path: "/orders?next=" + cursorOf(math.MaxInt64), header: svc.As(t, "alice")},
		{path: "/orders?next=" + cursorOf(1<<63), header: svc.As(t, "alice")},
		{path: "/orders?next=" + cursorOf(uint64(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())), header: svc.As(t, "alice")},
		{path: "/orders?customer_id=%ff", header: svc.AsAdmin(t)},
		{path: "/orders?customer_id=%00", header: svc.AsAdmin(t)},
		{path: "/orders/%ff", header: svc.As(t, "alice")},
	} {
		var problem json.RawMessage
		resp := svc.Do(t, http.MethodGet, tc.path, tc.header, nil, &problem)
		requireProblem(t, resp, problem, http.StatusBadRequest)
	}
	for _, name := range []string{"\\u0000", "a\\u0000b", "\\u001b[31mred", "\\ud800"} {
		var problem json.RawMessage
		resp := svc.Do(t, http.MethodPut, "/products/plum", svc.AsAdmin(t), json.RawMessage(`{"name":"`+name+`","unit_price_cents":1}`), &problem)
		requireProblem(t, resp, problem, http.StatusBadRequest)
	}
	for _, body := range []string{
		`{"customer_email":"a\u0000@example.com","items":[{"sku":"apple","quantity":1}]}`,
		`{"items":[{"sku":"app\u0000le","quantity":1}]}`,
	} {
		var problem json.RawMessage
		resp := svc.Do(t, http.MethodPost, "/orders", svc.As(t, "alice", key(uuid.NewString())), json.RawMessage(body), &problem)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusUnprocessableEntity}, resp.StatusCode, body)
	}
}

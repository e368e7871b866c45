package order_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/services/order"
)

func TestAnotherCustomersOrderDoesNotExist(t *testing.T) {
	t.Parallel()
	svc := start(t)
	placed := place(t, svc, "alice")

	var o order.Order
	resp := svc.Do(t, http.MethodGet, "/orders/"+placed.ID.String(), svc.As(t, "alice"), nil, &o)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the owner sees it")
	resp = svc.Do(t, http.MethodGet, "/orders/"+placed.ID.String(), svc.AsAdmin(t), nil, &o)
	require.Equal(t, http.StatusOK, resp.StatusCode, "an operator sees it")

	var body json.RawMessage
	resp = svc.Do(t, http.MethodGet, "/orders/"+placed.ID.String(), svc.As(t, "bob"), nil, &body)
	requireProblem(t, resp, body, http.StatusNotFound)
	var list order.OrderList
	resp = svc.Do(t, http.MethodGet, "/orders", svc.As(t, "bob"), nil, &list)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, list.Orders, "bob lists his own orders only")
}

func TestSubjectsThatCannotBeCustomersPlaceNothing(t *testing.T) {
	t.Parallel()
	svc := start(t)
	for _, sub := range []string{"a b", "alice@example.com", "a/b", "..."} {
		var body json.RawMessage
		resp := svc.Do(t, http.MethodPost, "/orders", svc.As(t, sub, key("k-"+sub)), json.RawMessage(validBody), &body)
		requireProblem(t, resp, body, http.StatusForbidden)
	}
	require.Zero(t, countRows(t, svc, "SELECT 1 FROM orders"))
}

func TestIdempotencyKeysAreTheCallers(t *testing.T) {
	t.Parallel()
	svc := start(t)
	body := json.RawMessage(`{"items":[{"sku":"apple","quantity":1}]}`)

	var alices, bobs, again order.Order
	resp := svc.Do(t, http.MethodPost, "/orders", svc.As(t, "alice", key("same-key")), body, &alices)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	// The same key and body from bob is bob's own first request: a new
	// order of his, not alice's replayed to him.
	resp = svc.Do(t, http.MethodPost, "/orders", svc.As(t, "bob", key("same-key")), body, &bobs)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	require.NotEqual(t, alices.ID, bobs.ID)
	require.Equal(t, "bob", bobs.CustomerID)

	resp = svc.Do(t, http.MethodPost, "/orders", svc.As(t, "alice", key("same-key")), body, &again)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	require.Equal(t, alices.ID, again.ID)
	require.Equal(t, 2, countRows(t, svc, "SELECT 1 FROM orders"))
}

func TestIdempotencyKeyOutsidePrintableASCIIIsRefused(t *testing.T) {
	t.Parallel()
	svc := start(t)
	// A byte that is not UTF-8 was a 500 (PostgreSQL refused it) and an
	// error line per request.
	for _, k := range []string{"cl\u00e9", "k\xff"} {
		var body json.RawMessage
		resp := svc.Do(t, http.MethodPost, "/orders", svc.As(t, "alice", key(k)), json.RawMessage(validBody), &body)
		requireProblem(t, resp, body, http.StatusBadRequest)
	}
	for _, table := range []string{"orders", "outbox", "idempotency_keys"} {
		require.Zero(t, countRows(t, svc, "SELECT 1 FROM "+table), "rows in %s", table)
	}
}

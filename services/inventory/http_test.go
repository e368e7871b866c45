package inventory_test

import (
	"cmp"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
)

// movement is a row of the stock ledger.
type movement struct {
	kind   string
	delta  int64
	reason string
}

// movements returns sku's stock movements in the order they were written.
func movements(t *testing.T, svc *apptest.Service, sku string) []movement {
	t.Helper()
	rows, err := svc.DB.Pool.Query(t.Context(), `SELECT kind, delta, reason FROM stock_movements WHERE sku = $1 ORDER BY id`, sku)
	require.NoError(t, err)
	defer rows.Close()
	var got []movement
	for rows.Next() {
		var m movement
		require.NoError(t, rows.Scan(&m.kind, &m.delta, &m.reason))
		got = append(got, m)
	}
	require.NoError(t, rows.Err())
	return got
}

func TestOnlyOperatorsChangeStock(t *testing.T) {
	t.Parallel()
	svc := start(t)
	resp := svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": 7}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for _, write := range []struct {
		method, path string
		body         any
	}{
		{http.MethodPost, "/stock/apple/receipts", map[string]int64{"quantity": 1000}},
		{http.MethodPost, "/stock/apple/adjustments", map[string]any{"delta": -7, "reason": "mine now"}},
		{http.MethodPut, "/stock/apple", map[string]int64{"available": 0}},
	} {
		var p httpapi.Problem
		resp := svc.Do(t, write.method, write.path, svc.As(t, "mallory", idempotencyKey(), http.Header{"If-Match": {`"1"`}}), write.body, &p)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s", write.method, write.path)
	}
	var item inventory.StockItem
	resp = svc.Do(t, http.MethodGet, "/stock/apple", svc.As(t, "mallory"), nil, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode, "anyone signed in reads a level")
	require.Equal(t, int64(7), item.Available)
}

func TestReceiptsAndAdjustmentsAreALedger(t *testing.T) {
	t.Parallel()
	svc := start(t)

	var item inventory.StockItem
	resp := svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": 7}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 7, Version: 1}, item)

	resp = svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": 5}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 12, Version: 2}, item, "a receipt adds to the level")

	resp = svc.Do(t, http.MethodPost, "/stock/apple/adjustments", svc.AsAdmin(t, idempotencyKey()), map[string]any{"delta": -2, "reason": "damaged"}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 10, Version: 3}, item)

	resp = svc.Do(t, http.MethodGet, "/stock/apple", svc.AsAdmin(t), nil, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 10, Version: 3}, item)
	require.Equal(t, `"3"`, resp.Header.Get("ETag"))

	var p httpapi.Problem
	resp = svc.Do(t, http.MethodPost, "/stock/apple/adjustments", svc.AsAdmin(t, idempotencyKey()), map[string]any{"delta": -11, "reason": "stolen"}, &p)
	require.Equal(t, http.StatusConflict, resp.StatusCode, "stock never goes negative")
	resp = svc.Do(t, http.MethodPost, "/stock/ghost/adjustments", svc.AsAdmin(t, idempotencyKey()), map[string]any{"delta": 1, "reason": "found"}, &p)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "an adjustment corrects a known SKU")
	resp = svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": inventory.MaxAvailable}, &p)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	resp = svc.Do(t, http.MethodPost, "/stock/apple/adjustments", svc.AsAdmin(t, idempotencyKey()), map[string]any{"delta": inventory.MaxAvailable, "reason": "typo"}, &p)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)

	require.Equal(t, []movement{
		{inventory.MovementReceipt, 7, ""},
		{inventory.MovementReceipt, 5, ""},
		{inventory.MovementAdjustment, -2, "damaged"},
	}, movements(t, svc, "apple"), "only the applied changes are movements")
	require.Equal(t, int64(10), available(t, svc, "apple"))

	resp = svc.Do(t, http.MethodPost, "/stock/SKU-42_b.x~/receipts", svc.AsAdmin(t, idempotencyKey()), map[string]int64{"quantity": 1}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode, "any printable ASCII is a SKU")
	require.Equal(t, "SKU-42_b.x~", item.SKU)
}

// TestRetriedReceiptAppliesOnce: a receipt whose answer was lost is sent
// again with its key, after a reservation took some of it. The retry gets
// the first answer back and adds nothing: the reserved units stay taken.
func TestRetriedReceiptAppliesOnce(t *testing.T) {
	t.Parallel()
	svc := start(t)
	key := idempotencyKey()
	var first, again inventory.StockItem
	resp := svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, key), map[string]int64{"quantity": 10}, &first)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	reserve(t, svc, line("apple", 3))

	resp = svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, key), map[string]int64{"quantity": 10}, &again)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(httpapi.HeaderReplayed))
	require.Equal(t, first, again, "the retry is answered as the first request")
	require.Equal(t, int64(7), available(t, svc, "apple"), "10 received once, 3 reserved")
	require.Equal(t, []movement{{inventory.MovementReceipt, 10, ""}}, movements(t, svc, "apple"))

	var p httpapi.Problem
	resp = svc.Do(t, http.MethodPost, "/stock/apple/receipts", svc.AsAdmin(t, key), map[string]int64{"quantity": 11}, &p)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the key with another request")
	resp = svc.Do(t, http.MethodPost, "/stock/pear/receipts", svc.AsAdmin(t, key), map[string]int64{"quantity": 10}, &p)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the key on another SKU")

	adjust := idempotencyKey()
	for range 2 {
		resp = svc.Do(t, http.MethodPost, "/stock/apple/adjustments", svc.AsAdmin(t, adjust), map[string]any{"delta": -2, "reason": "damaged"}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, int64(5), available(t, svc, "apple"), "a retried adjustment applies once")
}

// TestStockCountCannotUndoAReservation: a count names the version it
// counted; a reservation since then changed it, and the count is refused
// rather than put the reserved units back.
func TestStockCountCannotUndoAReservation(t *testing.T) {
	t.Parallel()
	svc := start(t)
	setStock(t, svc, "apple", 10)
	var counted inventory.StockItem
	resp := svc.Do(t, http.MethodGet, "/stock/apple", svc.AsAdmin(t), nil, &counted)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	etag := resp.Header.Get("ETag")
	reserve(t, svc, line("apple", 3))

	var p httpapi.Problem
	resp = svc.Do(t, http.MethodPut, "/stock/apple", svc.AsAdmin(t, http.Header{"If-Match": {etag}}), map[string]int64{"available": 10}, &p)
	require.Equal(t, http.StatusPreconditionFailed, resp.StatusCode, p.Detail)
	resp = svc.Do(t, http.MethodPut, "/stock/apple", svc.AsAdmin(t), map[string]int64{"available": 10}, &p)
	require.Equal(t, http.StatusPreconditionRequired, resp.StatusCode, "a level is never set unconditionally")
	// "*" matches any version (RFC 9110): it names no count, so it would
	// overwrite the reservation like no condition at all.
	for _, match := range []string{"*", "W/" + etag, etag + ", *"} {
		resp = svc.Do(t, http.MethodPut, "/stock/apple", svc.AsAdmin(t, http.Header{"If-Match": {match}}), map[string]int64{"available": 10}, &p)
		require.Equal(t, http.StatusPreconditionFailed, resp.StatusCode, "If-Match: %s", match)
	}
	require.Equal(t, int64(7), available(t, svc, "apple"), "the reservation stands")

	var item inventory.StockItem
	resp = svc.Do(t, http.MethodGet, "/stock/apple", svc.AsAdmin(t), nil, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = svc.Do(t, http.MethodPut, "/stock/apple", svc.AsAdmin(t, http.Header{"If-Match": {resp.Header.Get("ETag")}}), map[string]any{"available": 6, "reason": "counted"}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode, "a count of the current version")
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 6, Version: counted.Version + 2}, item)
	require.Equal(t, strconv.Quote(strconv.FormatInt(item.Version, 10)), resp.Header.Get("ETag"))
	require.Equal(t, []movement{{inventory.MovementReceipt, 10, ""}, {inventory.MovementCount, -1, "counted"}}, movements(t, svc, "apple"))

	resp = svc.Do(t, http.MethodPut, "/stock/ghost", svc.AsAdmin(t, http.Header{"If-Match": {`"1"`}}), map[string]int64{"available": 1}, &p)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "a count sets the level of a known SKU")
}

// reserve has the saga reserve lines of a new order and waits until it is.
func reserve(t *testing.T, svc *apptest.Service, lines ...event.OrderLine) {
	t.Helper()
	outcomes := svc.Watch(t, streams.Inventory, "inventory.>")
	svc.Publish(t, paymentDebited(t, lines...))
	require.Equal(t, event.StockReserved, outcomes.Wait(t, 1)[0].Type)
}

func TestGetStockRefusesUnknownAndInvalidSKUs(t *testing.T) {
	t.Parallel()
	svc := start(t)
	tests := []struct {
		name, path string
		want       int
	}{
		{"unknown sku", "/stock/ghost", http.StatusNotFound},
		{"sku too long", "/stock/" + strings.Repeat("s", 129), http.StatusBadRequest},
		{"non-ASCII sku", "/stock/%C3%A9clair", http.StatusBadRequest},
		{"sku with a space", "/stock/a%20b", http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var p httpapi.Problem
			resp := svc.Do(t, http.MethodGet, tt.path, svc.AsAdmin(t), nil, &p)
			require.Equal(t, tt.want, resp.StatusCode)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
			require.Equal(t, tt.want, p.Status)
		})
	}
}

func TestBadStockRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	svc := start(t)
	tooMany := strconv.Itoa(inventory.MaxAvailable + 1)
	const receipts, adjustments = "/stock/apple/receipts", "/stock/apple/adjustments"
	tests := []struct {
		name   string
		method string // default POST
		path   string
		header http.Header // default an Idempotency-Key and application/json
		body   []byte
		want   int
	}{
		{"malformed", "", receipts, nil, []byte(`{"quantity":`), http.StatusBadRequest},
		{"empty object", "", receipts, nil, []byte(`{}`), http.StatusBadRequest},
		{"null quantity", "", receipts, nil, []byte(`{"quantity":null}`), http.StatusBadRequest},
		{"zero quantity", "", receipts, nil, []byte(`{"quantity":0}`), http.StatusBadRequest},
		{"negative quantity", "", receipts, nil, []byte(`{"quantity":-1}`), http.StatusBadRequest},
		{"quantity above the cap", "", receipts, nil, []byte(`{"quantity":` + tooMany + `}`), http.StatusBadRequest},
		{"overflowing number", "", receipts, nil, []byte(`{"quantity":1e30}`), http.StatusBadRequest},
		{"huge integer", "", receipts, nil, []byte(`{"quantity":100000000000000000000000}`), http.StatusBadRequest},
		{"fractional quantity", "", receipts, nil, []byte(`{"quantity":1.5}`), http.StatusBadRequest},
		{"string quantity", "", receipts, nil, []byte(`{"quantity":"5"}`), http.StatusBadRequest},
		{"unknown field", "", receipts, nil, []byte(`{"quantity":5,"reserved":1}`), http.StatusBadRequest},
		{"trailing data", "", receipts, nil, []byte(`{"quantity":5}{"quantity":6}`), http.StatusBadRequest},
		{"array body", "", receipts, nil, []byte(`[5]`), http.StatusBadRequest},
		{"empty body", "", receipts, nil, []byte(``), http.StatusBadRequest},
		{"no Idempotency-Key", "", receipts, http.Header{"Content-Type": {"application/json"}}, []byte(`{"quantity":5}`), http.StatusBadRequest},
		{"not JSON", "", receipts, http.Header{"Content-Type": {"text/plain"}, "Idempotency-Key": {"k"}}, []byte(`{"quantity":5}`), http.StatusUnsupportedMediaType},
		{"oversized", "", receipts, nil, []byte(`{"quantity":5,"x":"` + strings.Repeat("a", 70<<10) + `"}`), http.StatusRequestEntityTooLarge},
		{"sku too long", "", "/stock/" + strings.Repeat("s", 129) + "/receipts", nil, []byte(`{"quantity":5}`), http.StatusBadRequest},
		{"non-ASCII sku", "", "/stock/%C3%A9clair/receipts", nil, []byte(`{"quantity":5}`), http.StatusBadRequest},
		{"sku with a space", "", "/stock/a%20b/receipts", nil, []byte(`{"quantity":5}`), http.StatusBadRequest},
		{"empty sku", "", "/stock//receipts", nil, []byte(`{"quantity":5}`), http.StatusBadRequest},
		{"zero delta", "", adjustments, nil, []byte(`{"delta":0,"reason":"none"}`), http.StatusBadRequest},
		{"delta without a reason", "", adjustments, nil, []byte(`{"delta":-1}`), http.StatusBadRequest},
		{"blank reason", "", adjustments, nil, []byte(`{"delta":-1,"reason":"  "}`), http.StatusBadRequest},
		{"long reason", "", adjustments, nil, []byte(`{"delta":-1,"reason":"` + strings.Repeat("x", 201) + `"}`), http.StatusBadRequest},
		{"delta below the cap", "", adjustments, nil, []byte(`{"delta":-` + tooMany + `,"reason":"x"}`), http.StatusBadRequest},
		// PostgreSQL stores no NUL: a 500 before the reason was checked.
		{"NUL in the reason", "", adjustments, nil, []byte(`{"delta":-1,"reason":"a\u0000b"}`), http.StatusBadRequest},
		{"escape in the reason", "", adjustments, nil, []byte(`{"delta":-1,"reason":"\u001b[2J"}`), http.StatusBadRequest},
		{"NUL in a count's reason", http.MethodPut, "/stock/apple", http.Header{"If-Match": {`"1"`}}, []byte(`{"available":1,"reason":"\u0000"}`), http.StatusBadRequest},
		{"count without a level", http.MethodPut, "/stock/apple", http.Header{"If-Match": {`"1"`}}, []byte(`{"available":null}`), http.StatusBadRequest},
		{"negative count", http.MethodPut, "/stock/apple", http.Header{"If-Match": {`"1"`}}, []byte(`{"available":-1}`), http.StatusBadRequest},
		{"count without If-Match", http.MethodPut, "/stock/apple", http.Header{}, []byte(`{"available":1}`), http.StatusPreconditionRequired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			header := tt.header
			if header == nil {
				header = idempotencyKey()
			}
			if header.Get("Content-Type") == "" {
				header.Set("Content-Type", "application/json")
			}
			var p httpapi.Problem
			resp := svc.Do(t, cmp.Or(tt.method, http.MethodPost), tt.path, svc.AsAdmin(t, header), tt.body, &p)
			require.Equal(t, tt.want, resp.StatusCode)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
			require.Equal(t, tt.want, p.Status)
			require.NotEmpty(t, p.Detail, "a refusal says why")

			var rows int
			require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
				`SELECT (SELECT count(*) FROM stock) + (SELECT count(*) FROM stock_movements) + (SELECT count(*) FROM idempotency_keys)`).Scan(&rows))
			require.Zero(t, rows, "a refused request writes nothing")
		})
	}
}

func TestOpenAPIDescribesTheRoutes(t *testing.T) {
	t.Parallel()
	start(t).RequireOpenAPI(t, inventory.New(nil).Routes)
}

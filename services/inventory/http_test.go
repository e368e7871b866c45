package inventory_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/inventory"
)

func TestStockLevelsOverHTTP(t *testing.T) {
	t.Parallel()
	svc := start(t)

	var item inventory.StockItem
	resp := svc.Do(t, http.MethodPut, "/stock/apple", nil, map[string]int64{"available": 7}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 7}, item)

	resp = svc.Do(t, http.MethodGet, "/stock/apple", nil, nil, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, inventory.StockItem{SKU: "apple", Available: 7}, item)

	// PUT sets the absolute level, so a retry sets the same level again.
	for _, level := range []int64{0, inventory.MaxAvailable, inventory.MaxAvailable, 3} {
		resp = svc.Do(t, http.MethodPut, "/stock/apple", nil, map[string]int64{"available": level}, &item)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, level, item.Available)
	}
	require.Equal(t, int64(3), available(t, svc, "apple"))

	resp = svc.Do(t, http.MethodPut, "/stock/SKU-42_b.x~", nil, map[string]int64{"available": 1}, &item)
	require.Equal(t, http.StatusOK, resp.StatusCode, "any printable ASCII is a SKU")
	require.Equal(t, "SKU-42_b.x~", item.SKU)
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
			resp := svc.Do(t, http.MethodGet, tt.path, nil, nil, &p)
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
	tests := []struct {
		name        string
		path        string
		contentType string // default application/json
		body        []byte
		want        int
	}{
		{"malformed", "/stock/apple", "", []byte(`{"available":`), http.StatusBadRequest},
		{"empty object", "/stock/apple", "", []byte(`{}`), http.StatusBadRequest},
		{"null level", "/stock/apple", "", []byte(`{"available":null}`), http.StatusBadRequest},
		{"negative level", "/stock/apple", "", []byte(`{"available":-1}`), http.StatusBadRequest},
		{"level above the cap", "/stock/apple", "", []byte(`{"available":` + tooMany + `}`), http.StatusBadRequest},
		{"overflowing number", "/stock/apple", "", []byte(`{"available":1e30}`), http.StatusBadRequest},
		{"huge integer", "/stock/apple", "", []byte(`{"available":100000000000000000000000}`), http.StatusBadRequest},
		{"fractional level", "/stock/apple", "", []byte(`{"available":1.5}`), http.StatusBadRequest},
		{"string level", "/stock/apple", "", []byte(`{"available":"5"}`), http.StatusBadRequest},
		{"unknown field", "/stock/apple", "", []byte(`{"available":5,"reserved":1}`), http.StatusBadRequest},
		{"trailing data", "/stock/apple", "", []byte(`{"available":5}{"available":6}`), http.StatusBadRequest},
		{"array body", "/stock/apple", "", []byte(`[5]`), http.StatusBadRequest},
		{"empty body", "/stock/apple", "", []byte(``), http.StatusBadRequest},
		{"not JSON", "/stock/apple", "text/plain", []byte(`{"available":5}`), http.StatusUnsupportedMediaType},
		{"oversized", "/stock/apple", "", []byte(`{"available":5,"x":"` + strings.Repeat("a", 70<<10) + `"}`), http.StatusRequestEntityTooLarge},
		{"sku too long", "/stock/" + strings.Repeat("s", 129), "", []byte(`{"available":5}`), http.StatusBadRequest},
		{"non-ASCII sku", "/stock/%C3%A9clair", "", []byte(`{"available":5}`), http.StatusBadRequest},
		{"sku with a space", "/stock/a%20b", "", []byte(`{"available":5}`), http.StatusBadRequest},
		{"empty sku", "/stock/", "", []byte(`{"available":5}`), http.StatusNotFound}, // no such route
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var header http.Header
			if tt.contentType != "" {
				header = http.Header{"Content-Type": {tt.contentType}}
			}
			var p httpapi.Problem
			resp := svc.Do(t, http.MethodPut, tt.path, header, tt.body, &p)
			require.Equal(t, tt.want, resp.StatusCode)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
			require.Equal(t, tt.want, p.Status)
			if tt.want != http.StatusNotFound {
				require.NotEmpty(t, p.Detail, "a refusal says why")
			}

			var rows int
			require.NoError(t, svc.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM stock`).Scan(&rows))
			require.Zero(t, rows, "a refused request writes nothing")
		})
	}
}

func TestOpenAPIDescribesTheRoutes(t *testing.T) {
	t.Parallel()
	start(t).RequireOpenAPI(t, inventory.New(nil).Routes)
}

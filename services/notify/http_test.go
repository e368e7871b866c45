package notify_test

import (
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/notify"
)

func TestListNotifications(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	placed := orderPlaced(t, "olga", "olga@shop.example")
	confirmed := milestone(t, placed, event.OrderConfirmed)
	other := orderPlaced(t, "pat", "")
	svc.Publish(t, placed)
	svc.Publish(t, confirmed)
	svc.Publish(t, other)
	requireProcessed(t, svc, 3)

	id := orderID(t, placed)
	var got []notify.Notification
	resp := svc.Do(t, http.MethodGet, "/notifications?order_id="+id.String(), svc.AsAdmin(t), nil, &got)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, echo.MIMEApplicationJSON, resp.Header.Get("Content-Type"))
	require.Len(t, got, 2)
	for i, n := range got {
		require.Contains(t, []string{notify.StatusPending, notify.StatusSent}, n.Status)
		got[i].Status = ""
	}
	require.Equal(t, []notify.Notification{
		{OrderID: id, Kind: notify.KindPlaced, Recipient: "olga@shop.example", EventID: placed.ID},
		{OrderID: id, Kind: notify.KindConfirmed, Recipient: "olga@shop.example", EventID: confirmed.ID},
	}, got)
}

func TestNotificationsAreTheCustomers(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	placed := orderPlaced(t, "olga", "olga@shop.example")
	svc.Publish(t, placed)
	requireProcessed(t, svc, 1)
	path := "/notifications?order_id=" + orderID(t, placed).String()

	var got []notify.Notification
	resp := svc.Do(t, http.MethodGet, path, svc.As(t, "olga"), nil, &got)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, got, 1)

	var p httpapi.Problem
	resp = svc.Do(t, http.MethodGet, path, svc.As(t, "pat"), nil, &p)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "another customer's order has none for pat")
	resp = svc.Do(t, http.MethodGet, "/notifications?order_id="+uuid.NewString(), svc.As(t, "pat"), nil, &p)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "as an order that does not exist")
}

func TestListNotificationsOfAnUnknownOrderIsEmpty(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	raw := get(t, svc.BaseURL+"/notifications?order_id="+uuid.NewString(), svc.AsAdmin(t))
	require.Equal(t, http.StatusOK, raw.status)
	require.JSONEq(t, `[]`, raw.body, "an array, never null")
}

func TestBadNotificationRequests(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	tests := []struct {
		name, method, target string
		want                 int
	}{
		{"missing order_id", http.MethodGet, "/notifications", http.StatusBadRequest},
		{"empty order_id", http.MethodGet, "/notifications?order_id=", http.StatusBadRequest},
		{"non-UUID order_id", http.MethodGet, "/notifications?order_id=nope", http.StatusBadRequest},
		{"number", http.MethodGet, "/notifications?order_id=42", http.StatusBadRequest},
		{"truncated UUID", http.MethodGet, "/notifications?order_id=" + uuid.NewString()[:35], http.StatusBadRequest},
		{"UUID with junk", http.MethodGet, "/notifications?order_id=" + url.QueryEscape(uuid.NewString()+"'; DROP TABLE notifications"), http.StatusBadRequest},
		{"huge order_id", http.MethodGet, "/notifications?order_id=" + strings.Repeat("a", 5000), http.StatusBadRequest},
		{"POST is not an API", http.MethodPost, "/notifications?order_id=" + uuid.NewString(), http.StatusMethodNotAllowed},
		{"DELETE is not an API", http.MethodDelete, "/notifications?order_id=" + uuid.NewString(), http.StatusMethodNotAllowed},
		{"unknown path", http.MethodGet, "/notifications/" + uuid.NewString(), http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p httpapi.Problem
			resp := svc.Do(t, tt.method, tt.target, svc.AsAdmin(t), nil, &p)
			require.Equal(t, tt.want, resp.StatusCode)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
			require.Equal(t, tt.want, p.Status)
		})
	}
	require.Zero(t, countNotifications(t, svc.DB.Pool), "a refused request writes nothing")
}

func TestOpenAPIDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	served := get(t, svc.BaseURL+"/openapi.yaml")
	require.Equal(t, "application/yaml", served.contentType)
	svc.RequireOpenAPI(t, notify.New(nil).Routes)
}

type response struct {
	status      int
	contentType string
	body        string
}

func get(t *testing.T, url string, header ...http.Header) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	for _, h := range header {
		maps.Copy(req.Header, h)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(body)}
}

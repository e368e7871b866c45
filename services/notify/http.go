package notify

import (
	_ "embed"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
)

//go:embed openapi.yaml
var openAPI []byte

// Notification is a notification as the API shows it.
type Notification struct {
	OrderID   uuid.UUID `json:"order_id"`
	Kind      string    `json:"kind"`
	Recipient string    `json:"recipient"`
	Status    string    `json:"status"`
	EventID   uuid.UUID `json:"event_id"`
}

// Routes registers the notify API.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.GET("/notifications", s.listNotifications)
}

func (s *Service) listNotifications(c echo.Context) error {
	raw := c.QueryParam("order_id")
	if raw == "" {
		return httpapi.BadRequest("the order_id query parameter is required")
	}
	orderID, err := uuid.Parse(raw)
	if err != nil {
		return httpapi.BadRequest("order_id %q is not a UUID", raw)
	}
	rows, err := s.queries.ListNotifications(c.Request().Context(), s.pool, orderID)
	if err != nil {
		return fmt.Errorf("list notifications of order %s: %w", orderID, err)
	}
	// A customer sees the notifications of their own orders; an order of
	// someone else's, or one with none yet, does not exist for them.
	if caller, _ := auth.Caller(c); !caller.Admin && (len(rows) == 0 || !auth.Sees(c, rows[0].CustomerID)) {
		return httpapi.NotFound("order %s has no notifications of yours", orderID)
	}
	out := make([]Notification, len(rows))
	for i, r := range rows {
		out[i] = Notification{OrderID: r.OrderID, Kind: r.Kind, Recipient: r.Recipient, Status: r.Status, EventID: r.EventID}
	}
	return c.JSON(http.StatusOK, out)
}

package order

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/mail"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

//go:embed openapi.yaml
var openAPI []byte

// Limits of one order. They keep a request far from the body size limit and
// the database's integer ranges; a total that overflows is refused as well.
const (
	MaxItems    = 100
	MaxQuantity = 1_000_000
	// maxEmailLength is RFC 5321's limit on a path.
	maxEmailLength = 254
)

// Bounds of GET /orders.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// Order is an order as the API shows it.
type Order struct {
	ID            uuid.UUID `json:"id"`
	CustomerID    string    `json:"customer_id"`
	CustomerEmail string    `json:"customer_email"`
	Status        string    `json:"status"`
	TotalCents    int64     `json:"total_cents"`
	Items         []Item    `json:"items"`
	// Timeline is every saga event of the order, once, in event time order.
	Timeline  []TimelineEntry `json:"timeline"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Item is one line of an order.
type Item struct {
	SKU            string `json:"sku"`
	Quantity       int32  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// TimelineEntry is one event in an order's timeline.
type TimelineEntry struct {
	Type    event.Type `json:"type"`
	EventID uuid.UUID  `json:"event_id"`
	At      time.Time  `json:"at"`
}

// OrderList is the response of GET /orders: an object rather than a bare
// array, so that it can grow (e.g. a cursor) without breaking clients.
type OrderList struct {
	Orders []Order `json:"orders"`
}

type placeRequest struct {
	CustomerID    string        `json:"customer_id"`
	CustomerEmail string        `json:"customer_email"`
	Items         []itemRequest `json:"items"`
}

type itemRequest struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	// A pointer, so that a missing price is refused rather than taken as 0.
	UnitPriceCents *int64 `json:"unit_price_cents"`
}

// Routes registers the order API.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.POST("/orders", s.place)
	e.GET("/orders", s.list)
	e.GET("/orders/:id", s.get)
}

func (s *Service) place(c echo.Context) error {
	body, err := httpapi.ReadBody(c)
	if err != nil {
		return err
	}
	var req placeRequest
	if err := httpapi.Decode(body, &req); err != nil {
		return err
	}
	lines, total, err := req.validate()
	if err != nil {
		return err
	}
	// Nothing is read: the key's claim, the order and the COMMIT take one
	// round trip.
	return httpapi.IdempotentWrites(c, s.idem, body, func(ctx context.Context, writes *postgres.Pipeline) (int, any, error) {
		// Under the key: a retry of an order already placed is replayed
		// however busy the saga is, and a refusal claims no key, so that
		// the client's retry with it can still succeed.
		if err := s.admission.admit(); err != nil {
			return 0, nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return 0, nil, fmt.Errorf("new order id: %w", err)
		}
		ev, err := event.New(Name, event.OrderPlaced, id.String(), event.OrderPlacedV1{
			Order:      event.Order{OrderID: id, CustomerID: req.CustomerID, CustomerEmail: req.CustomerEmail},
			Lines:      lines,
			TotalCents: total,
		})
		if err != nil {
			return 0, nil, err
		}
		params := dbsqlc.InsertOrderWithLinesParams{
			ID:              id,
			CustomerID:      req.CustomerID,
			CustomerEmail:   req.CustomerEmail,
			TotalCents:      total,
			PlacedEventID:   ev.ID,
			PlacedEventType: string(ev.Type),
			PlacedAt:        ev.Time,
		}
		items := make([]Item, len(lines))
		for i, l := range lines {
			params.LineNos = append(params.LineNos, int32(i+1))
			params.Skus = append(params.Skus, l.SKU)
			params.Quantities = append(params.Quantities, l.Quantity)
			params.UnitPricesCents = append(params.UnitPricesCents, l.UnitPriceCents)
			items[i] = Item{SKU: l.SKU, Quantity: l.Quantity, UnitPriceCents: l.UnitPriceCents}
		}
		// The event in the outbox and the order, its lines and the
		// OrderPlaced timeline entry in one statement.
		if err := outbox.Queue(ctx, writes, ev); err != nil {
			return 0, nil, err
		}
		if err := s.queries.InsertOrderWithLines(ctx, writes, params); err != nil {
			return 0, nil, fmt.Errorf("place order: %w", err)
		}
		// As GET will show it: the order is created at its event's time,
		// which is kept to the microsecond the database stores, so the
		// stored response and a later GET agree.
		return http.StatusCreated, Order{
			ID:            id,
			CustomerID:    req.CustomerID,
			CustomerEmail: req.CustomerEmail,
			Status:        StatusPending,
			TotalCents:    total,
			Items:         items,
			Timeline:      []TimelineEntry{{Type: ev.Type, EventID: ev.ID, At: ev.Time}},
			CreatedAt:     ev.Time.UTC(),
			UpdatedAt:     ev.Time.UTC(),
		}, nil
	})
}

// validate checks everything about the request that does not need the
// database, and returns its lines and total.
func (r placeRequest) validate() (event.Lines, int64, error) {
	if err := httpapi.CheckID("customer_id", r.CustomerID); err != nil {
		return nil, 0, err
	}
	if r.CustomerEmail != "" {
		addr, err := mail.ParseAddress(r.CustomerEmail)
		// Only a bare address: it is what notify sends to.
		if err != nil || addr.Name != "" || addr.Address != r.CustomerEmail || len(r.CustomerEmail) > maxEmailLength {
			return nil, 0, httpapi.BadRequest("customer_email %q is not a plain e-mail address", r.CustomerEmail)
		}
	}
	if len(r.Items) == 0 || len(r.Items) > MaxItems {
		return nil, 0, httpapi.BadRequest("items must have 1 to %d lines", MaxItems)
	}
	lines := make(event.Lines, len(r.Items))
	skus := make(map[string]bool, len(r.Items))
	for i, it := range r.Items {
		if err := httpapi.CheckID(fmt.Sprintf("items[%d].sku", i), it.SKU); err != nil {
			return nil, 0, err
		}
		// One line per SKU: inventory reserves per line, and two lines of
		// one SKU are a client mistake more often than an intent.
		if skus[it.SKU] {
			return nil, 0, httpapi.BadRequest("items[%d].sku %q appears twice", i, it.SKU)
		}
		skus[it.SKU] = true
		if it.Quantity < 1 || it.Quantity > MaxQuantity {
			return nil, 0, httpapi.BadRequest("items[%d].quantity must be between 1 and %d", i, MaxQuantity)
		}
		if it.UnitPriceCents == nil || *it.UnitPriceCents < 0 {
			return nil, 0, httpapi.BadRequest("items[%d].unit_price_cents is required and must not be negative", i)
		}
		lines[i] = event.OrderLine{SKU: it.SKU, Quantity: int32(it.Quantity), UnitPriceCents: *it.UnitPriceCents}
	}
	total, err := lines.Total()
	if err != nil {
		return nil, 0, httpapi.BadRequest("the order's total is too large: %v", err)
	}
	return lines, total, nil
}

func (s *Service) get(c echo.Context) error {
	id, err := httpapi.PathUUID(c, "id")
	if err != nil {
		return err
	}
	v, err := s.queries.GetOrderView(c.Request().Context(), s.pool, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return httpapi.NotFound("order %s does not exist", id)
	case err != nil:
		return fmt.Errorf("get order %s: %w", id, err)
	}
	o, err := orderOf(v)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

func (s *Service) list(c echo.Context) error {
	customerID := c.QueryParam("customer_id")
	if err := httpapi.CheckID("customer_id", customerID); err != nil {
		return err
	}
	limit := DefaultListLimit
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			return httpapi.BadRequest("limit must be an integer between 1 and %d", MaxListLimit)
		}
		limit = n
	}
	views, err := s.queries.ListCustomerOrderViews(c.Request().Context(), s.pool, dbsqlc.ListCustomerOrderViewsParams{
		CustomerID: customerID,
		MaxRows:    int32(limit),
	})
	if err != nil {
		return fmt.Errorf("list orders of %s: %w", customerID, err)
	}
	orders := make([]Order, len(views))
	for i, v := range views {
		if orders[i], err = orderOf(v); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, OrderList{Orders: orders})
}

// orderOf is the API's view of an order read from order_views, which reads
// an order with its items and timeline in one statement, and so in one
// snapshot even while events change the order.
func orderOf(v dbsqlc.OrderView) (Order, error) {
	o := Order{
		ID:            v.ID,
		CustomerID:    v.CustomerID,
		CustomerEmail: v.CustomerEmail,
		Status:        v.Status,
		TotalCents:    v.TotalCents,
		CreatedAt:     v.CreatedAt.UTC(),
		UpdatedAt:     v.UpdatedAt.UTC(),
	}
	if err := json.Unmarshal(v.Items, &o.Items); err != nil {
		return Order{}, fmt.Errorf("items of order %s: %w", v.ID, err)
	}
	if err := json.Unmarshal(v.Timeline, &o.Timeline); err != nil {
		return Order{}, fmt.Errorf("timeline of order %s: %w", v.ID, err)
	}
	for i := range o.Timeline {
		o.Timeline[i].At = o.Timeline[i].At.UTC()
	}
	return o, nil
}

package order

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/mail"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
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
)

// Bounds of GET /orders.
const (
	DefaultListLimit = 50
	MaxListLimit     = 100
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
	// Deadline is when the order expires unless the saga has ended it;
	// orders placed before deadlines existed have none.
	Deadline *time.Time `json:"deadline,omitempty"`
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
	// Reason is why, for the events that carry one.
	Reason string `json:"reason,omitempty"`
	// Late is the fate of a reply that arrived once the order was terminal
	// (docs/saga.md): "refunded", "released" or "unchanged".
	Late string `json:"late,omitempty"`
}

// OrderList is the response of GET /orders: a page of orders, newest
// first, and the cursor of the next page (pass it as ?next=), empty on the
// last page.
type OrderList struct {
	Orders []Order `json:"orders"`
	Next   string  `json:"next,omitempty"`
}

// placeRequest is the body of POST /orders. The customer is the token's
// subject: a body that names one is refused as an unknown member.
type placeRequest struct {
	CustomerEmail string        `json:"customer_email"`
	Items         []itemRequest `json:"items"`
}

// itemRequest is a line of POST /orders: the price is the catalog's, and a
// body that gives one is refused as an unknown member.
type itemRequest struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// Routes registers the order API.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	var limit []echo.MiddlewareFunc
	if s.perCaller != nil {
		limit = append(limit, s.perCaller)
	}
	e.POST("/orders", s.place, limit...)
	e.GET("/orders", s.list)
	e.GET("/orders/:id", s.get)
	e.PUT("/products/:sku", s.putProduct, auth.AdminOnly)
	e.GET("/products", s.listProducts)
	e.GET("/products/:sku", s.getProduct)
}

// PublicRoutes are the routes anyone may call: the catalog's reads.
func PublicRoutes() []string { return []string{"GET /products", "GET /products/:sku"} }

func (s *Service) place(c echo.Context) error {
	body, err := httpapi.ReadBody(c)
	if err != nil {
		return err
	}
	var req placeRequest
	if err := httpapi.Decode(body, &req); err != nil {
		return err
	}
	caller, _ := auth.Caller(c)
	customer := buyer{CustomerID: caller.Subject, CustomerEmail: cmp.Or(req.CustomerEmail, caller.Email)}
	if err := customer.check(); err != nil {
		return err
	}
	lines, err := req.validate()
	if err != nil {
		return err
	}
	if customer.CustomerEmail, err = recipient(req.CustomerEmail, caller.Email); err != nil {
		return err
	}
	// One round trip when the prices are guessed (see price): the key's
	// claim, the prices' check, the order, its outbox row, the stored
	// response and the COMMIT; two when they are read first. A guess the
	// check refuses rolled everything back, key included: place again,
	// reading them.
	check := &priceCheck{}
	err = httpapi.IdempotentWrites(c, s.idem, body, s.placeOrder(customer, lines, check))
	if check.refused(err) {
		err = httpapi.IdempotentWrites(c, s.idem, body, s.placeOrder(customer, lines, nil))
	}
	return err
}

// placeOrder is the write of POST /orders: the order, priced from the
// catalog (guessed, with check, or read, see price), with its OrderPlaced in
// the outbox.
func (s *Service) placeOrder(customer buyer, lines event.Lines, check *priceCheck) httpapi.Write {
	return func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
		// A refusal claims no key, so that the client's retry with it can
		// still succeed, and a retry of an order already placed is
		// replayed however busy the saga is (DoWrites looks the key up).
		if err := s.admission.admit(); err != nil {
			return 0, nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return 0, nil, fmt.Errorf("new order id: %w", err)
		}
		// A check of guessed prices is queued before the writes: when it
		// fails, they do not run.
		total, err := s.price(ctx, tx, writes, lines, check)
		if err != nil {
			return 0, nil, err
		}
		ev, err := event.New(Name, event.OrderPlaced, id.String(), event.OrderPlacedV1{
			Order:      event.Order{OrderID: id, CustomerID: customer.CustomerID, CustomerEmail: customer.CustomerEmail},
			Lines:      lines,
			TotalCents: total,
		})
		if err != nil {
			return 0, nil, err
		}
		deadline := ev.Time.Add(s.deadline).Truncate(time.Microsecond)
		params, items := newOrderRows(id, customer, ev, lines, total)
		params.Deadline = &deadline
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
			CustomerID:    customer.CustomerID,
			CustomerEmail: customer.CustomerEmail,
			Status:        StatusPending,
			TotalCents:    total,
			Items:         items,
			Timeline:      []TimelineEntry{{Type: ev.Type, EventID: ev.ID, At: ev.Time}},
			CreatedAt:     ev.Time.UTC(),
			UpdatedAt:     ev.Time.UTC(),
			Deadline:      &deadline,
		}, nil
	}
}

// newOrderRows are the rows of a new order, and its lines as the API shows
// them.
func newOrderRows(id uuid.UUID, customer buyer, ev event.Envelope, lines event.Lines, total int64) (dbsqlc.InsertOrderWithLinesParams, []Item) {
	params := dbsqlc.InsertOrderWithLinesParams{
		ID:              id,
		CustomerID:      customer.CustomerID,
		CustomerEmail:   customer.CustomerEmail,
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
	return params, items
}

// buyer is who an order is for: the caller, at the token's e-mail address
// (see recipient).
type buyer struct{ CustomerID, CustomerEmail string }

// check refuses a subject that cannot be a customer (403: the token is
// valid, but not for placing orders) and an address that is not a bare one.
func (o buyer) check() error {
	if err := event.CheckCustomerID(o.CustomerID); err != nil {
		return httpapi.NewProblem(http.StatusForbidden, "the token's subject cannot place orders: %v", err)
	}
	if o.CustomerEmail != "" {
		addr, err := mail.ParseAddress(o.CustomerEmail)
		// Only a bare address: it is what notify sends to.
		if err != nil || addr.Name != "" || addr.Address != o.CustomerEmail || len(o.CustomerEmail) > auth.MaxEmailLength {
			return httpapi.BadRequest("customer_email %q is not a plain e-mail address", o.CustomerEmail)
		}
	}
	return nil
}

// recipient is the address an order's e-mails go to: the token's verified
// e-mail. The body's customer_email may repeat it (the case of its letters
// aside) or be left out; any other address is refused (422), never
// silently replaced, so that a customer cannot have the order's e-mails
// sent to someone else, and a client learns that its address was not
// used. A token without an e-mail places orders with none, and no
// customer_email.
func recipient(body, verified string) (string, error) {
	if body == "" || strings.EqualFold(body, verified) {
		return verified, nil
	}
	if verified == "" {
		return "", httpapi.NewProblem(http.StatusUnprocessableEntity, "customer_email must be the token's e-mail, and the token has none: leave it out")
	}
	return "", httpapi.NewProblem(http.StatusUnprocessableEntity, "customer_email must be the token's e-mail (or be left out)")
}

// validate checks everything about the request's lines that does not need
// the database, and returns them, to be priced.
func (r placeRequest) validate() (event.Lines, error) {
	if len(r.Items) == 0 || len(r.Items) > MaxItems {
		return nil, httpapi.BadRequest("items must have 1 to %d lines", MaxItems)
	}
	lines := make(event.Lines, len(r.Items))
	skus := make(map[string]bool, len(r.Items))
	for i, it := range r.Items {
		if err := httpapi.CheckID(fmt.Sprintf("items[%d].sku", i), it.SKU); err != nil {
			return nil, err
		}
		// One line per SKU: inventory reserves per line, and two lines of
		// one SKU are a client mistake more often than an intent.
		if skus[it.SKU] {
			return nil, httpapi.BadRequest("items[%d].sku %q appears twice", i, it.SKU)
		}
		skus[it.SKU] = true
		if it.Quantity < 1 || it.Quantity > MaxQuantity {
			return nil, httpapi.BadRequest("items[%d].quantity must be between 1 and %d", i, MaxQuantity)
		}
		lines[i] = event.OrderLine{SKU: it.SKU, Quantity: int32(it.Quantity)}
	}
	return lines, nil
}

func (s *Service) get(c echo.Context) error {
	id, err := httpapi.PathUUID(c, "id")
	if err != nil {
		return err
	}
	v, err := s.queries.GetOrderView(c.Request().Context(), s.pool, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && !auth.Sees(c, v.CustomerID):
		// Another customer's order is one that does not exist, for the caller.
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
	q, err := listQuery(c)
	if err != nil {
		return err
	}
	views, err := s.queries.ListCustomerOrderViews(c.Request().Context(), s.pool, dbsqlc.ListCustomerOrderViewsParams{
		CustomerID:      q.customer,
		BeforeCreatedAt: q.after.createdAt,
		BeforeID:        q.after.id,
		MaxRows:         int32(q.limit + 1), // one more: is there a next page?
	})
	if err != nil {
		return fmt.Errorf("list orders of %s: %w", q.customer, err)
	}
	var list OrderList
	if len(views) > q.limit {
		views = views[:q.limit]
		last := views[len(views)-1]
		list.Next = cursor{createdAt: last.CreatedAt, id: last.ID}.String()
	}
	list.Orders = make([]Order, len(views))
	for i, v := range views {
		if list.Orders[i], err = orderOf(v); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, list)
}

// ordersQuery is what GET /orders asks for.
type ordersQuery struct {
	customer string
	limit    int
	after    cursor
}

// listQuery reads GET /orders' query: the caller's own orders, or an
// operator's choice of customer_id; a limit; the cursor of a next page.
func listQuery(c echo.Context) (ordersQuery, error) {
	caller, _ := auth.Caller(c)
	q := ordersQuery{customer: cmp.Or(c.QueryParam("customer_id"), caller.Subject), after: firstPage}
	if err := event.CheckCustomerID(q.customer); err != nil {
		return q, httpapi.BadRequest("customer_id: %v", err)
	}
	if !auth.Sees(c, q.customer) {
		return q, httpapi.NewProblem(http.StatusForbidden, "only an operator lists another customer's orders")
	}
	var err error
	if q.limit, err = httpapi.QueryLimit(c, DefaultListLimit, MaxListLimit); err != nil {
		return q, err
	}
	if v := c.QueryParam("next"); v != "" {
		if q.after, err = parseCursor(v); err != nil {
			return q, httpapi.BadRequest("next: %v", err)
		}
	}
	return q, nil
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
	if v.Deadline != nil {
		d := v.Deadline.UTC()
		o.Deadline = &d
	}
	return o, nil
}

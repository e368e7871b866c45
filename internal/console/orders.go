package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/console/internal/orderdb"
	"github.com/onceflow/onceflow/internal/console/internal/platformdb"
	"github.com/onceflow/onceflow/internal/event"
)

// ordersPerPage bounds the orders list and its live refresh.
const ordersPerPage = 50

// statuses are the order statuses, for the filter.
var statuses = []string{"PENDING", "PAID", "CONFIRMED", "REJECTED", "CANCELLED", "EXPIRED"}

// ordersQuery is the list's search: an order id, or a customer, and a
// status; Before is the page's cursor.
type ordersQuery struct {
	Q, Status string
	Before    uuid.UUID
}

// readOrdersQuery reads the list's search from c's query, or is a 400 when
// q is neither an order id nor a customer id, which is all it can find (and
// a customer id is what reaches the database: no NUL nor invalid UTF-8).
func readOrdersQuery(c echo.Context) (ordersQuery, error) {
	q := ordersQuery{Q: strings.TrimSpace(c.QueryParam("q")), Status: c.QueryParam("status")}
	if !slices.Contains(statuses, q.Status) {
		q.Status = ""
	}
	q.Before, _ = uuid.Parse(c.QueryParam("before"))
	if _, err := uuid.Parse(q.Q); q.Q != "" && err != nil && event.CheckCustomerID(q.Q) != nil {
		return q, echo.NewHTTPError(http.StatusBadRequest, "search for an order id or a customer id")
	}
	return q, nil
}

func (s *Server) ordersPage(c echo.Context) error {
	q, err := readOrdersQuery(c)
	if err != nil {
		return err
	}
	if id, err := uuid.Parse(q.Q); err == nil {
		return c.Redirect(http.StatusSeeOther, "/orders/"+id.String())
	}
	data, err := s.orders(c, q)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, "orders", data)
}

func (s *Server) ordersRows(c echo.Context) error {
	q, err := readOrdersQuery(c)
	if err != nil {
		return err
	}
	data, err := s.orders(c, q)
	if err != nil {
		return err
	}
	return s.renderFragment(c, "orders", "rows", data)
}

func (s *Server) orders(c echo.Context, q ordersQuery) (map[string]any, error) {
	rows, err := orderdb.New().ListOrders(c.Request().Context(), s.pools["order"], orderdb.ListOrdersParams{
		Before: q.Before, CustomerID: q.Q, Status: q.Status, MaxRows: ordersPerPage + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("list orders: %w", err)
	}
	data := map[string]any{"Query": q, "Statuses": statuses}
	if len(rows) > ordersPerPage {
		rows = rows[:ordersPerPage]
		data["Next"] = rows[len(rows)-1].ID
	}
	data["Orders"] = rows
	return data, nil
}

func (s *Server) orderPage(c echo.Context) error {
	data, err := s.orderData(c)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, "order", data)
}

func (s *Server) orderSaga(c echo.Context) error {
	data, err := s.orderData(c)
	if err != nil {
		return err
	}
	return s.renderFragment(c, "order", "saga", data)
}

func (s *Server) orderData(c echo.Context) (map[string]any, error) {
	ctx := c.Request().Context()
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return nil, echo.NewHTTPError(http.StatusNotFound, "no such order")
	}
	q := orderdb.New()
	o, err := q.GetOrder(ctx, s.pools["order"], id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, echo.NewHTTPError(http.StatusNotFound, "no such order")
	}
	if err != nil {
		return nil, fmt.Errorf("order %s: %w", id, err)
	}
	lines, err := q.OrderLines(ctx, s.pools["order"], id)
	if err != nil {
		return nil, fmt.Errorf("order %s lines: %w", id, err)
	}
	timeline, err := q.OrderTimeline(ctx, s.pools["order"], id)
	if err != nil {
		return nil, fmt.Errorf("order %s timeline: %w", id, err)
	}
	hops, err := s.hops(c, timeline)
	if err != nil {
		return nil, err
	}
	terminal := o.Status == "CONFIRMED" || o.Status == "REJECTED" || o.Status == "CANCELLED" || o.Status == "EXPIRED"
	done := terminal && !slices.ContainsFunc(hops, func(h hop) bool { return h.Pending })
	return map[string]any{
		"Order": o, "Lines": lines, "Timeline": timeline,
		"Saga": drawSaga(hops), "Hops": hops, "Done": done,
	}, nil
}

// hop is one event's way from the service that emitted it to one of its
// consumers.
type hop struct {
	EventID   uuid.UUID
	Type      event.Type
	From, To  string // services
	Durable   string
	At        time.Time // the event's time
	Processed time.Time // the consumer's inbox row; zero when Pending
	Pending   bool
	Reason    string
	// Kind is "compensation" (a refund, a cancellation), "rejection" or "".
	Kind string
	// Late is the fate of a reply that reached the order service after
	// the order was terminal (docs/saga.md): "refunded", "released" or
	// "unchanged"; empty for every other hop.
	Late string
}

// Latency is the hop's: from the event's time to its processing.
func (h hop) Latency() time.Duration { return h.Processed.Sub(h.At) }

// hops are the timeline's events, each to each of its consumers, in the
// order they happened.
func (s *Server) hops(c echo.Context, timeline []orderdb.OrderTimelineRow) ([]hop, error) {
	var out []hop
	byDurable := map[string][]uuid.UUID{}
	for _, ev := range timeline {
		typ := event.Type(ev.EventType)
		subject, err := typ.NATSSubject()
		if err != nil {
			continue // an event type this console does not know
		}
		for _, cons := range s.topology.Consumers {
			if !slices.Contains(cons.FilterSubjects, subject) {
				continue
			}
			h := hop{
				EventID: ev.EventID, Type: typ, From: owner(typ), To: serviceOf(cons.Durable), Durable: cons.Durable,
				At: ev.At, Pending: true, Reason: ev.Reason, Kind: kindOf(typ),
			}
			// The fate is the order service's verdict on the reply's
			// arrival there, not on its other consumers'.
			if h.To == "order" {
				h.Late = ev.Late
			}
			out = append(out, h)
			byDurable[cons.Durable] = append(byDurable[cons.Durable], ev.EventID)
		}
	}
	processed := map[string]map[uuid.UUID]time.Time{}
	for durable, ids := range byDurable {
		pool, ok := s.pools[serviceOf(durable)]
		if !ok {
			continue
		}
		rows, err := platformdb.New().ProcessedAt(c.Request().Context(), pool, platformdb.ProcessedAtParams{Consumer: durable, EventIds: ids})
		if err != nil {
			return nil, fmt.Errorf("inbox of %s: %w", durable, err)
		}
		processed[durable] = map[uuid.UUID]time.Time{}
		for _, r := range rows {
			processed[durable][r.EventID] = r.ProcessedAt
		}
	}
	for i, h := range out {
		if at, ok := processed[h.Durable][h.EventID]; ok {
			out[i].Processed, out[i].Pending = at, false
		}
	}
	slices.SortStableFunc(out, func(a, b hop) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(lane(a.To), lane(b.To)))
	})
	return out, nil
}

// owner is the service that emits events of typ: "onceflow.<domain>.…".
func owner(typ event.Type) string {
	parts := strings.Split(string(typ), ".")
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// serviceOf is the service of a durable: durables are "<service>-<subscription>".
func serviceOf(durable string) string {
	service, _, _ := strings.Cut(durable, "-")
	return service
}

// kindOf marks the saga's compensations and rejections.
func kindOf(typ event.Type) string {
	switch typ {
	case event.PaymentRefunded, event.StockRejected, event.OrderCancelled, event.OrderExpired:
		return "compensation"
	case event.PaymentRejected, event.OrderRejected:
		return "rejection"
	}
	return ""
}

// lane is a service's lane, from the left.
func lane(service string) int {
	if i := slices.Index(services, service); i >= 0 {
		return i
	}
	return len(services)
}

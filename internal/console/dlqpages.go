package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/dlq"
)

// dlqPerPage bounds the DLQ list.
const dlqPerPage = 50

func (s *Server) dlqPage(c echo.Context) error {
	f := dlq.Filter{
		Consumer: c.QueryParam("consumer"),
		Type:     c.QueryParam("type"),
		Reason:   c.QueryParam("reason"),
		OrderID:  c.QueryParam("order"),
		Status:   dlq.Status(c.QueryParam("status")),
		Limit:    dlqPerPage,
	}
	f.After, _ = strconv.ParseUint(c.QueryParam("after"), 10, 64)
	if d, err := time.ParseDuration(c.QueryParam("age")); err == nil && d > 0 {
		f.Since = time.Now().Add(-d)
	}
	page, err := s.dlq.List(c.Request().Context(), f)
	if err != nil {
		return err
	}
	var consumers []string
	for _, c := range s.topology.Consumers {
		consumers = append(consumers, c.Durable)
	}
	return s.render(c, http.StatusOK, "dlq", map[string]any{
		"Filter": f, "Age": c.QueryParam("age"), "List": page, "Consumers": consumers,
		"Statuses": []dlq.Status{dlq.Open, dlq.Replayed, dlq.Discarded}, "Query": c.QueryParams(),
	})
}

func (s *Server) dlqEntryPage(c echo.Context) error {
	id, err := strconv.ParseUint(c.Param("id"), 10, 64)
	if err != nil {
		return echo.NewHTTPError(http.StatusNotFound, "no such DLQ entry")
	}
	e, err := s.dlq.Get(c.Request().Context(), id)
	if errors.Is(err, dlq.ErrNotFound) {
		return echo.NewHTTPError(http.StatusNotFound, "no such DLQ entry")
	}
	if err != nil {
		return err
	}
	who, _ := s.who(c)
	return s.render(c, http.StatusOK, "dlqentry", map[string]any{
		"Entry": e, "Payload": prettyJSON(e.Data), "Operator": who,
		"Done": c.QueryParam("done"), "Refused": c.QueryParam("refused"),
	})
}

// operator lets only an operator through to next, from the console's own
// pages; who it is, is in the context's "operator".
func (s *Server) operator(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !sameOrigin(c.Request()) {
			return echo.NewHTTPError(http.StatusForbidden, "a form from another site")
		}
		who, err := s.who(c)
		switch {
		case errors.Is(err, ErrUnauthenticated):
			return echo.NewHTTPError(http.StatusUnauthorized, "only an operator can do this: sign in first")
		case errors.Is(err, ErrForbidden):
			return echo.NewHTTPError(http.StatusForbidden, "only an operator can do this: not an operator")
		case err != nil:
			return err // logged, not shown
		}
		c.Set("operator", who)
		return next(c)
	}
}

// who is the operator the request's credentials name.
func (s *Server) who(c echo.Context) (string, error) {
	op, err := s.operatorOf(c.Request())
	return op.Name, err
}

func (s *Server) dlqReplay(c echo.Context) error {
	id, err := strconv.ParseUint(c.Param("id"), 10, 64)
	if err != nil {
		return echo.NewHTTPError(http.StatusNotFound, "no such DLQ entry")
	}
	_, err = s.dlq.Replay(c.Request().Context(), id, dlq.ReplayOptions{
		By: c.Get("operator").(string), PastRetention: c.FormValue("past_retention") == "on", Force: c.FormValue("force") == "on",
	})
	return s.afterAction(c, id, "replayed", err)
}

func (s *Server) dlqDiscard(c echo.Context) error {
	id, err := strconv.ParseUint(c.Param("id"), 10, 64)
	if err != nil {
		return echo.NewHTTPError(http.StatusNotFound, "no such DLQ entry")
	}
	reason := strings.TrimSpace(c.FormValue("reason"))
	if reason == "" {
		return s.afterAction(c, id, "", &dlq.RefusedError{Entry: id, Reason: "a discard needs a reason"})
	}
	_, err = s.dlq.Discard(c.Request().Context(), id, c.Get("operator").(string), reason)
	return s.afterAction(c, id, "discarded", err)
}

// afterAction sends the browser back to the entry's page, saying what was
// done or why it was refused.
func (s *Server) afterAction(c echo.Context, id uint64, done string, err error) error {
	var refused *dlq.RefusedError
	switch {
	case errors.As(err, &refused):
		return c.Redirect(http.StatusSeeOther, fmt.Sprintf("/dlq/%d?refused=%s", id, url.QueryEscape(refused.Reason)))
	case errors.Is(err, dlq.ErrNotFound):
		return echo.NewHTTPError(http.StatusNotFound, "no such DLQ entry")
	case err != nil:
		return err
	}
	return c.Redirect(http.StatusSeeOther, fmt.Sprintf("/dlq/%d?done=%s", id, done))
}

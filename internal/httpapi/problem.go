package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/postgres"
)

// busyRetryAfter is the Retry-After of a request refused because the
// database was busy (postgres.Timeouts ran out).
const busyRetryAfter = time.Second

// ContentTypeProblem is the media type of RFC 9457 problem details.
const ContentTypeProblem = "application/problem+json"

// Problem is an RFC 9457 problem detail, returned as an error by handlers.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header: when
	// the client may try again.
	RetryAfter time.Duration `json:"-"`
}

func (p *Problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail) }

// NewProblem returns a problem with the standard title of status.
func NewProblem(status int, format string, args ...any) *Problem {
	return &Problem{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: fmt.Sprintf(format, args...),
	}
}

// BadRequest is a 400 problem: the request is malformed and nothing was written.
func BadRequest(format string, args ...any) *Problem {
	return NewProblem(http.StatusBadRequest, format, args...)
}

// NotFound is a 404 problem.
func NotFound(format string, args ...any) *Problem {
	return NewProblem(http.StatusNotFound, format, args...)
}

// Unavailable is a 503 problem: the service refuses the request for now,
// and the client may send it again after retryAfter.
func Unavailable(retryAfter time.Duration, format string, args ...any) *Problem {
	p := NewProblem(http.StatusServiceUnavailable, format, args...)
	p.RetryAfter = retryAfter
	return p
}

// ErrorHandler maps every error a handler returns to a problem response.
// Problems and echo's own HTTP errors keep their status; anything else is a
// 500 with no detail, logged here and nowhere else. A 5xx is logged as an
// error, except a refusal with a Retry-After (Unavailable): shedding load
// is the service working as meant, its metrics count it, and an error line
// per refused request would flood the logs just when the service is
// busiest. An error of the database's bounded waits (postgres.IsTimeout)
// while the client still waits is such a refusal: 503 with Retry-After.
func ErrorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := toProblem(err)
		if p.Status == http.StatusInternalServerError && c.Request().Context().Err() == nil && postgres.IsTimeout(err) {
			// The client still waits, so the deadline was the service's own:
			// the pool had no connection free in time, or a statement ran
			// past its statement_timeout. The database is busy; shed load.
			p = Unavailable(busyRetryAfter, "the database is busy")
		}
		if p.Status >= http.StatusInternalServerError {
			level := slog.LevelError
			if p.RetryAfter > 0 {
				level = slog.LevelDebug
			}
			logger.Log(c.Request().Context(), level, "request failed",
				"method", c.Request().Method, "path", c.Path(), "err", err)
		}
		c.Response().Header().Set(echo.HeaderContentType, ContentTypeProblem)
		if p.RetryAfter > 0 {
			// Whole seconds, rounded up: HTTP has no finer unit.
			c.Response().Header().Set(echo.HeaderRetryAfter, strconv.Itoa(int(math.Ceil(p.RetryAfter.Seconds()))))
		}
		if c.Request().Method == http.MethodHead {
			err = c.NoContent(p.Status)
		} else {
			err = c.JSON(p.Status, p)
		}
		if err != nil {
			logger.WarnContext(c.Request().Context(), "write problem response", "err", err)
		}
	}
}

func toProblem(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		detail := ""
		if msg, ok := he.Message.(string); ok && msg != http.StatusText(he.Code) {
			detail = msg
		}
		return NewProblem(he.Code, "%s", detail)
	}
	return NewProblem(http.StatusInternalServerError, "")
}

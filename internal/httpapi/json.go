package httpapi

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"unicode"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/event"
)

// MaxBodyBytes bounds every request body; a larger body is a 413.
const MaxBodyBytes = 64 << 10

// ReadBody reads the request body, refusing one that is too large or not JSON.
func ReadBody(c echo.Context) ([]byte, error) {
	req := c.Request()
	if mt, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType)); err != nil || mt != echo.MIMEApplicationJSON {
		return nil, NewProblem(http.StatusUnsupportedMediaType, "the body must be application/json")
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, NewProblem(http.StatusRequestEntityTooLarge, "the body exceeds %d bytes", MaxBodyBytes)
		}
		return nil, BadRequest("read body: %v", err)
	}
	return body, nil
}

// Decode strictly decodes one JSON value into v, as the event layer decodes
// payloads (encoding/json/v2's rules, see event.Envelope.Decode): member
// names match exactly, so a name that differs only in case is unknown; an
// unknown member, a name given twice, invalid UTF-8, trailing data and a
// type mismatch are 400 problems. encoding/json took the last of two
// duplicates and matched names case-insensitively: {"amount_cents":1,
// "AMOUNT_CENTS":5} credited 5.
func Decode(body []byte, v any) error {
	if err := jsonv2.Unmarshal(body, v, jsonv2.RejectUnknownMembers(true)); err != nil {
		return BadRequest("invalid JSON body: %v", err)
	}
	return nil
}

// Bind reads and strictly decodes the request body into v.
func Bind(c echo.Context, v any) error {
	body, err := ReadBody(c)
	if err != nil {
		return err
	}
	return Decode(body, v)
}

// PathUUID parses the path parameter name as a UUID, or is a 400 problem.
func PathUUID(c echo.Context, name string) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param(name))
	if err != nil {
		return uuid.Nil, BadRequest("%s %q is not a UUID", name, c.Param(name))
	}
	return id, nil
}

// PathCustomer returns the path parameter name as a customer id, or a 400
// problem when it breaks event.CheckCustomerID.
func PathCustomer(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if err := event.CheckCustomerID(v); err != nil {
		return "", BadRequest("%s: %v", name, err)
	}
	return v, nil
}

// maxIDLength bounds free-form identifiers in paths (SKUs).
const maxIDLength = 128

// PathString returns the path parameter name, or a 400 problem when it is
// empty, too long or not printable ASCII.
func PathString(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if err := CheckID(name, v); err != nil {
		return "", err
	}
	return v, nil
}

// QueryLimit returns a page's size from the query parameter limit: def
// when it is absent, or a 400 problem unless it is an integer from 1 to max.
func QueryLimit(c echo.Context, def, max int) (int, error) {
	v := c.QueryParam("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, BadRequest("limit must be an integer between 1 and %d", max)
	}
	return n, nil
}

// CheckID is a 400 problem when an identifier is empty, longer than 128
// bytes or has characters other than printable ASCII without spaces.
func CheckID(name, v string) error {
	if v == "" || len(v) > maxIDLength {
		return BadRequest("%s must be 1 to %d characters", name, maxIDLength)
	}
	for _, r := range v {
		if r <= ' ' || r > '~' {
			return BadRequest("%s must be printable ASCII without spaces", name)
		}
	}
	return nil
}

// CheckText is a 400 problem when a free text (a reason, a name) is longer
// than maxChars characters, is not UTF-8 or has control characters other
// than tab and line breaks: PostgreSQL stores no NUL, and a terminal or a
// log shows the others as commands.
func CheckText(name, v string, maxChars int) error {
	if utf8.RuneCountInString(v) > maxChars {
		return BadRequest("%s is longer than %d characters", name, maxChars)
	}
	if !utf8.ValidString(v) {
		return BadRequest("%s is not UTF-8", name)
	}
	for _, r := range v {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return BadRequest("%s has a control character (%U)", name, r)
		}
	}
	return nil
}

// IsNumericOverflow reports whether err is PostgreSQL's numeric_value_out_of_range.
func IsNumericOverflow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22003"
}

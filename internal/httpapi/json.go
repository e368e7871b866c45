package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
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

// Decode strictly decodes one JSON value into v: unknown fields, trailing
// data and type mismatches are 400 problems.
func Decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return BadRequest("invalid JSON body: trailing data after the object")
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

// maxIDLength bounds free-form identifiers in paths (customer ids, SKUs).
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

// IsNumericOverflow reports whether err is PostgreSQL's numeric_value_out_of_range.
func IsNumericOverflow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22003"
}

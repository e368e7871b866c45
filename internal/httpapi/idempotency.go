package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/postgres"
)

// Header names of the Idempotency-Key protocol (IETF httpapi draft).
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
	maxKeyLength         = 255
)

// Write is a request's database write: it runs in the transaction that also
// stores the Idempotency-Key, and returns the status and the value to send.
// Writes whose answers it does not need it may queue on writes, to go with
// the COMMIT (see idempotency.Func).
type Write func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (status int, v any, err error)

// Idempotent runs write under the request's Idempotency-Key and sends its
// response, or the stored response of an earlier request with the same key
// (with Idempotent-Replayed: true). body is the request body, already read:
// it is part of the fingerprint. A missing key is a 400, a key reused with a
// different request a 422, a key whose first request is still running a 409.
func Idempotent(c echo.Context, store *idempotency.Store, body []byte, write Write) error {
	return idempotent(c, body, write, store.Do)
}

// IdempotentWrites is Idempotent with the key's claim sent with the
// queued writes and the COMMIT, a round trip fewer, on the bet that the key
// is new (see idempotency.Store.DoWrites): for a write whose reads take no
// locks, as they run again on a retry.
func IdempotentWrites(c echo.Context, store *idempotency.Store, body []byte, write Write) error {
	return idempotent(c, body, write, store.DoWrites)
}

// idempotent checks the request's key, runs write under it with do (one of
// the store's ways) and sends the response.
func idempotent(c echo.Context, body []byte, write Write, do func(context.Context, idempotency.Request, idempotency.Func) (idempotency.Response, bool, error)) error {
	req := c.Request()
	key := req.Header.Get(HeaderIdempotencyKey)
	if err := checkKey(key); err != nil {
		return err
	}
	// A key is its caller's: the same key from another subject is another
	// key, neither replaying nor blocking the first caller's request.
	caller, _ := auth.Caller(c)
	resp, replayed, err := do(req.Context(), idempotency.Request{
		Scope:       req.Method + " " + c.Path() + " " + caller.Subject,
		Key:         key,
		Fingerprint: idempotency.Fingerprint([]byte(req.Method), []byte(req.URL.Path), body),
	}, func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (idempotency.Response, error) {
		return response(write(ctx, tx, writes))
	})
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		return NewProblem(http.StatusUnprocessableEntity, "the %s was used with a different request", HeaderIdempotencyKey)
	case errors.Is(err, idempotency.ErrInFlight):
		return NewProblem(http.StatusConflict, "a request with this %s is still being processed; retry later", HeaderIdempotencyKey)
	case err != nil:
		return err
	}
	for k, v := range resp.Header {
		c.Response().Header().Set(k, v)
	}
	if replayed {
		c.Response().Header().Set(HeaderReplayed, "true")
	}
	return c.Blob(resp.Status, c.Response().Header().Get(echo.HeaderContentType), resp.Body)
}

// checkKey is a 400 problem unless key is 1 to 255 characters of printable
// ASCII (space to tilde), as the IETF draft's examples and Stripe's keys
// are: anything else, a byte PostgreSQL's UTF-8 text cannot hold
// included, is refused before it reaches the database.
func checkKey(key string) error {
	switch {
	case key == "":
		return BadRequest("the %s header is required", HeaderIdempotencyKey)
	case len(key) > maxKeyLength:
		return BadRequest("the %s header is longer than %d bytes", HeaderIdempotencyKey, maxKeyLength)
	}
	for i := range len(key) {
		if key[i] < ' ' || key[i] > '~' {
			return BadRequest("the %s header must be printable ASCII", HeaderIdempotencyKey)
		}
	}
	return nil
}

// response is the stored form of a write's answer: v as JSON.
func response(status int, v any, err error) (idempotency.Response, error) {
	if err != nil {
		return idempotency.Response{}, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("encode response: %w", err)
	}
	return idempotency.Response{
		Status: status,
		Header: map[string]string{echo.HeaderContentType: echo.MIMEApplicationJSON},
		Body:   b,
	}, nil
}

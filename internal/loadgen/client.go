package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// client sends the run's requests, each with a token of the issuer for
// the caller it is sent as.
type client struct {
	http *http.Client
	cfg  Config

	mu     sync.Mutex
	tokens map[caller]string
}

// caller is whom a request is sent as: a customer, or the operator who
// seeds.
type caller struct {
	subject string
	admin   bool
}

// operator is the caller that credits wallets and stocks SKUs.
var operator = caller{subject: "loadgen-operator", admin: true}

// customer is the caller that places and reads id's orders.
func customer(id string) caller { return caller{subject: id} }

// email is the address of the customer id: in their token, and in their
// orders.
func email(id string) string { return id + "@loadgen.example" }

// token returns a token for who, from the issuer's POST /token the first
// time. The run is shorter than the issuer's tokens live.
func (c *client) token(ctx context.Context, who caller) (string, error) {
	c.mu.Lock()
	tok, ok := c.tokens[who]
	c.mu.Unlock()
	if ok {
		return tok, nil
	}
	// A customer's token carries their e-mail, the only address their
	// orders may name.
	form := url.Values{"sub": {who.subject}, "email": {email(who.subject)}}
	if who.admin {
		form = url.Values{"sub": {who.subject}, "role": {"admin"}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.IssuerURL+"/token", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if who.admin {
		req.Header.Set("Authorization", "Bearer "+c.cfg.OperatorSecret)
	}
	var answer struct {
		AccessToken string `json:"access_token"`
	}
	if err := c.send(req, &answer); err != nil {
		return "", fmt.Errorf("token for %s: %w", who.subject, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens == nil {
		c.tokens = map[caller]string{}
	}
	c.tokens[who] = answer.AccessToken
	return answer.AccessToken, nil
}

// statusError is an HTTP answer that was not the one wanted.
type statusError struct {
	status int
	body   string
	// retryAfter is the answer's Retry-After, when it gave one in seconds.
	retryAfter time.Duration
}

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// retryable reports whether a request that failed with err may succeed when
// sent again with the same Idempotency-Key: a transport error or time-out,
// a 409 (the first request with the key is still running), a 429 or a 5xx.
func retryable(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.status == http.StatusConflict || se.status == http.StatusTooManyRequests || se.status >= 500
	}
	return !errors.Is(err, context.Canceled)
}

// do sends method url as who with body as JSON (nil: none) and decodes a
// 2xx answer into out (nil: discarded).
func (c *client) do(ctx context.Context, who caller, method, url, idempotencyKey string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	tok, err := c.token(ctx, who)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return c.send(req, out)
}

// send sends req and decodes a 2xx answer into out (nil: discarded).
func (c *client) send(req *http.Request, out any) error {
	method, target := req.Method, req.URL.Redacted()
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, target, err)
	}
	if resp.StatusCode/100 != 2 {
		se := &statusError{status: resp.StatusCode, body: string(bytes.TrimSpace(b))}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			se.retryAfter = time.Duration(s) * time.Second
		}
		return se
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, target, err)
	}
	return nil
}

// retry calls f until it succeeds, fails for good, or ctx ends, waiting
// between attempts from 50ms doubling to 1s, or as long as the answer's
// Retry-After asks. retried counts the attempts after the first.
func retry(ctx context.Context, retried func(), f func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		retried()
		wait := delay
		if se := (*statusError)(nil); errors.As(err, &se) {
			wait = max(wait, se.retryAfter)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

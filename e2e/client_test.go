package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/internal/httpapi"
)

// client is the load's HTTP client. It retries what a careful client
// retries — transport errors, time-outs, 5xx, and 409 (the key's first
// request still in flight) — with the same Idempotency-Key and body, until it
// gets another answer or its budget is spent.
type client struct {
	hc     *http.Client
	budget time.Duration
	// token authenticates every request: an operator's, who may do
	// everything the load does.
	token string
	// retries counts the attempts beyond the first.
	retries atomic.Int64
}

func newClient(token string) *client {
	return &client{
		token: token,
		hc: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		},
		budget: 3 * time.Minute,
	}
}

// close drops the idle connections, which would outlive the test as
// goroutines.
func (c *client) close() { c.hc.CloseIdleConnections() }

// response is an HTTP answer, read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(httpapi.HeaderReplayed) == "true" }

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// do sends the request until it is answered with neither 5xx nor 409.
// Headers in extra are set last (e.g. another caller's Authorization).
func (c *client) do(ctx context.Context, method, url, key string, body []byte, extra ...http.Header) (response, error) {
	deadline := time.Now().Add(c.budget)
	delay := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.retries.Add(1)
		}
		resp, err := c.once(ctx, method, url, key, body, extra...)
		retry := err != nil || resp.status >= 500 || resp.status == http.StatusConflict
		if !retry {
			return resp, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("last answer %s", resp)
			}
			return response{}, fmt.Errorf("%s %s (key %q): gave up after %d attempts: %w", method, url, key, attempt+1, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay/2 + rand.N(delay)):
		}
		delay = min(2*delay, time.Second)
	}
}

// once sends the request once, without retrying. Headers in extra are set
// last.
func (c *client) once(ctx context.Context, method, url, key string, body []byte, extra ...http.Header) (response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(httpapi.HeaderIdempotencyKey, key)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for _, h := range extra {
		for k, v := range h {
			req.Header[k] = v
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return response{}, fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

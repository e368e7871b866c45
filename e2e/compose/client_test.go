package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The demo's published addresses, as the README's calls use them.
const (
	orderURL     = "http://127.0.0.1:8080"
	paymentURL   = "http://127.0.0.1:8081"
	inventoryURL = "http://127.0.0.1:8082"
	issuerURL    = "http://127.0.0.1:8084"
	mailpitURL   = "http://127.0.0.1:8025"
	consoleURL   = "http://127.0.0.1:8090"
)

// client is the test's HTTP client, a user's curl.
type client struct {
	http *http.Client
}

func newClient() *client {
	return &client{http: &http.Client{Timeout: 15 * time.Second}}
}

// answer is an HTTP answer: status, headers and body.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with a bearer token (if any), a JSON body (if any)
// and the headers given as name, value pairs.
func (c *client) do(ctx context.Context, method, u, token string, body any, headers ...string) (answer, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// json sends a request and decodes a 2xx answer into out.
func (c *client) json(t *testing.T, method, u, token string, body, out any, headers ...string) answer {
	t.Helper()
	a, err := c.do(t.Context(), method, u, token, body, headers...)
	require.NoError(t, err, "%s %s", method, u)
	require.True(t, a.status/100 == 2, "%s %s: %d %s", method, u, a.status, a.body)
	if out != nil {
		require.NoError(t, json.Unmarshal(a.body, out), "%s %s: %s", method, u, a.body)
	}
	return a
}

// token asks the dev issuer for a token, as the README's
// `curl -X POST localhost:8084/token -d sub=alice` does, presenting the
// operator secret (an admin token needs it) unless it is "".
func (c *client) token(t *testing.T, form url.Values, secret string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, issuerURL+"/token", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := c.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&tok))
	require.NotEmpty(t, tok.AccessToken)
	return tok.AccessToken
}

// order is what GET /orders/{id} answers, in part.
type order struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	Timeline []struct {
		Type string `json:"type"`
	} `json:"timeline"`
}

// terminal reports whether an order's saga is over.
func terminal(status string) bool {
	switch status {
	case "CONFIRMED", "CANCELLED", "REJECTED", "EXPIRED":
		return true
	}
	return false
}

// awaitOrder polls an order until its status is terminal or timeout passes,
// and returns it.
func (c *client) awaitOrder(ctx context.Context, token, id string, timeout time.Duration) (order, error) {
	deadline := time.Now().Add(timeout)
	var o order
	for {
		a, err := c.do(ctx, http.MethodGet, orderURL+"/orders/"+id, token, nil)
		if err == nil && a.status == http.StatusOK {
			if err := json.Unmarshal(a.body, &o); err != nil {
				return o, fmt.Errorf("order %s: %w", id, err)
			}
			if terminal(o.Status) {
				return o, nil
			}
		}
		if time.Now().After(deadline) {
			return o, fmt.Errorf("order %s still %q after %s (last error %v)", id, o.Status, timeout, err)
		}
		select {
		case <-ctx.Done():
			return o, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// await polls cond every 200ms until it holds or timeout passes.
func await(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s (last: %s)", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

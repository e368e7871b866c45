package compose

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// loadWithFaults places n orders of one apple for a customer of its own
// from 8 workers; a third of the way through it restarts the payment
// service's container, two thirds through it kills the NATS container and
// starts it again. Every POST is retried with its Idempotency-Key until it
// is answered (bounded: 3 minutes), and every order must reach a terminal
// status within 5 minutes of the last POST. It returns the orders' ids.
func loadWithFaults(t *testing.T, p *project, c *client, admin string, n int) []string {
	customer := "loader"
	c.json(t, http.MethodPost, paymentURL+"/wallets/"+customer+"/credits", admin, map[string]int64{"amount_cents": int64(n) * 1000}, nil, "Idempotency-Key", "load-credit")
	c.json(t, http.MethodPost, inventoryURL+"/stock/apple/receipts", admin, map[string]int64{"quantity": int64(n)}, nil, "Idempotency-Key", "load-receipt")
	token := c.token(t, url.Values{"sub": {customer}, "email": {"loader@example.com"}}, "")

	ids := make([]string, n)
	var placed atomic.Int64
	faults := make(chan error, 1)
	go func() { faults <- injectFaults(t.Context(), p, &placed, n) }()

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				id, err := placeOrder(ctx, c, token, "load-"+strconv.Itoa(i))
				if err != nil {
					errs <- err
					continue
				}
				ids[i] = id
				placed.Add(1)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, <-faults)

	statuses := map[string]int{}
	for _, id := range ids {
		o, err := c.awaitOrder(t.Context(), token, id, 5*time.Minute)
		require.NoError(t, err)
		statuses[o.Status]++
	}
	t.Logf("%d orders under faults: %v", n, statuses)
	return ids
}

// placeOrder POSTs one apple under key until the order service answers
// 2xx, and returns the order's id.
func placeOrder(ctx context.Context, c *client, token, key string) (string, error) {
	body := map[string]any{"items": []map[string]any{{"sku": "apple", "quantity": 1}}}
	for {
		a, err := c.do(ctx, http.MethodPost, orderURL+"/orders", token, body, "Idempotency-Key", key)
		if err == nil && a.status/100 == 2 {
			var o order
			if err := json.Unmarshal(a.body, &o); err != nil {
				return "", err
			}
			return o.ID, nil
		}
		if err == nil && a.status/100 == 4 && a.status != http.StatusConflict && a.status != http.StatusTooManyRequests {
			return "", &statusError{key: key, status: a.status, body: string(a.body)}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

type statusError struct {
	key    string
	status int
	body   string
}

func (e *statusError) Error() string {
	return "order " + e.key + ": HTTP " + strconv.Itoa(e.status) + ": " + e.body
}

// injectFaults restarts payment's container once a third of n orders are
// placed, then kills the NATS container at two thirds and starts it again.
func injectFaults(ctx context.Context, p *project, placed *atomic.Int64, n int) error {
	at := func(k int64) error {
		for placed.Load() < k {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		return nil
	}
	steps := []struct {
		at   int64
		args [][]string
	}{
		{int64(n / 3), [][]string{{"restart", "payment"}}},
		{int64(2 * n / 3), [][]string{{"kill", "nats"}, {"start", "nats"}}},
	}
	for _, s := range steps {
		if err := at(s.at); err != nil {
			return err
		}
		for _, args := range s.args {
			if out, err := p.run(ctx, args...); err != nil {
				return &faultError{args: args, out: out, err: err}
			}
		}
	}
	return nil
}

type faultError struct {
	args []string
	out  string
	err  error
}

func (e *faultError) Error() string {
	return "docker compose " + e.args[0] + ": " + e.err.Error() + ": " + e.out
}

// audit runs `onceflow audit` in the compose network, with the console's
// environment (the four databases, NATS as the operator): zero violations.
func audit(t *testing.T, p *project) {
	out := p.compose(t, "run", "--rm", "--no-deps", "console", "audit", "--wait", "2m")
	t.Logf("onceflow audit:\n%s", out)
}

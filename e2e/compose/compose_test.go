package compose

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The services `up` must bring to healthy, and the one-shot jobs that must
// exit 0.
var (
	longRunning = []string{"postgres", "nats", "issuer", "order", "payment", "inventory", "notify", "console", "mailpit"}
	jobs        = []string{"nats-auth", "provision", "seed"}
)

func TestComposeDemo(t *testing.T) {
	if os.Getenv("COMPOSE_DEMO_TEST") == "" {
		// Minutes of image builds and containers: not part of go test ./...
		t.Skip("compose demo: set COMPOSE_DEMO_TEST=1 to run it (make demo-test and .ci/run do)")
	}
	if why := dockerMissing(t.Context()); why != "" {
		t.Skip("compose demo: " + why)
	}
	// The services export their traces to the profile's Jaeger. The
	// operator secret has no default: the run makes its own, as the README
	// tells a reader to.
	secret := rand.Text()
	environ := append(standIns(t), "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318", "ISSUER_OPERATOR_SECRET="+secret)
	p := &project{name: "onceflow-demo-test", environ: environ}
	if out, err := p.run(t.Context(), "version"); err != nil {
		t.Skip("compose demo: no `docker compose` (Compose v2): " + firstLine([]byte(out)))
	}
	p.down(t) // a run killed before its cleanup
	t.Cleanup(func() { p.down(t) })

	// up --wait, as scripts and CI run it, returns once every service is
	// healthy and every job has exited, and fails on a job that exited
	// (even with 0) that no service waits for (the seed did).
	up := time.Now()
	p.compose(t, "--profile", "observability", "up", "--build", "--detach", "--wait", "--wait-timeout", "600")
	p.awaitHealthy(t, time.Minute, append(longRunning, observability...), jobs)
	t.Logf("up --build --wait to healthy and seeded: %s", time.Since(up).Round(100*time.Millisecond))

	c := newClient()
	alice := c.token(t, url.Values{"sub": {"alice"}, "email": {"alice@example.com"}}, "")
	admin := c.token(t, url.Values{"sub": {"ops"}, "role": {"admin"}}, secret)
	confirmed, first := readmeCalls(t, c, alice)
	t.Logf("up to the first CONFIRMED order: %s", confirmed.Sub(up).Round(100*time.Millisecond))
	cancelledForPlums(t, c, alice)
	consoleNeedsSignIn(t, c, admin)

	ids := loadWithFaults(t, p, c, admin, 300)
	audit(t, p)
	t.Logf("%d orders placed under faults, every one terminal; audit clean", len(ids))

	scrapedByPrometheus(t, c)
	tracedInJaeger(t, c, first)
	dashboardAnswers(t, c)
}

// readmeCalls are the README's calls: alice orders three apples, the
// order is CONFIRMED, her wallet debited once (a retry of the POST is a
// replay), the stock down by three, and two e-mails in Mailpit. It returns
// when the order was first seen CONFIRMED, and its id.
func readmeCalls(t *testing.T, c *client, alice string) (time.Time, string) {
	body := map[string]any{"customer_email": "alice@example.com", "items": []map[string]any{{"sku": "apple", "quantity": 3}}}
	var placed order
	c.json(t, http.MethodPost, orderURL+"/orders", alice, body, &placed, "Idempotency-Key", "demo-1")
	o, err := c.awaitOrder(t.Context(), alice, placed.ID, 2*time.Minute)
	require.NoError(t, err)
	confirmed := time.Now()
	require.Equal(t, "CONFIRMED", o.Status)

	var again order
	a := c.json(t, http.MethodPost, orderURL+"/orders", alice, body, &again, "Idempotency-Key", "demo-1")
	require.Equal(t, placed.ID, again.ID)
	require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))

	var wallet struct {
		BalanceCents int64 `json:"balance_cents"`
	}
	c.json(t, http.MethodGet, paymentURL+"/wallets/alice", alice, nil, &wallet)
	require.Equal(t, int64(100_000-3*120), wallet.BalanceCents, "debited once")
	var stock struct {
		Available int64 `json:"available"`
	}
	c.json(t, http.MethodGet, inventoryURL+"/stock/apple", alice, nil, &stock)
	require.Equal(t, int64(100-3), stock.Available)

	await(t, time.Minute, "two e-mails in Mailpit for order "+placed.ID, func() (bool, string) {
		var found struct {
			Count int `json:"messages_count"`
		}
		a, err := c.do(t.Context(), http.MethodGet, mailpitURL+"/api/v1/search?query="+url.QueryEscape(placed.ID), "", nil)
		if err != nil || a.status != http.StatusOK {
			return false, fmt.Sprintf("%v %d %s", err, a.status, a.body)
		}
		if err := json.Unmarshal(a.body, &found); err != nil {
			return false, err.Error()
		}
		return found.Count == 2, string(a.body)
	})
	return confirmed, placed.ID
}

// cancelledForPlums: plums (stock 0) cancel the order and refund alice.
func cancelledForPlums(t *testing.T, c *client, alice string) {
	body := map[string]any{"customer_email": "alice@example.com", "items": []map[string]any{{"sku": "plum", "quantity": 1}}}
	var placed order
	c.json(t, http.MethodPost, orderURL+"/orders", alice, body, &placed, "Idempotency-Key", "demo-plums")
	o, err := c.awaitOrder(t.Context(), alice, placed.ID, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", o.Status)
	var types []string
	for _, e := range o.Timeline {
		types = append(types, e.Type)
	}
	require.Contains(t, strings.Join(types, " "), "refund", "the saga timeline: %v", types)
	await(t, time.Minute, "alice refunded", func() (bool, string) {
		var wallet struct {
			BalanceCents int64 `json:"balance_cents"`
		}
		c.json(t, http.MethodGet, paymentURL+"/wallets/alice", alice, nil, &wallet)
		return wallet.BalanceCents == 100_000-3*120, strconv.FormatInt(wallet.BalanceCents, 10)
	})
}

// consoleNeedsSignIn: a stranger is sent to the sign-in; an operator sees
// the orders' sagas.
func consoleNeedsSignIn(t *testing.T, c *client, admin string) {
	noRedirect := &http.Client{Timeout: 15 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(consoleURL + "/orders")
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEqual(t, http.StatusOK, resp.StatusCode, "the console shows its orders to a stranger")

	a := c.json(t, http.MethodGet, consoleURL+"/orders", admin, nil, nil)
	require.Contains(t, string(a.body), "CONFIRMED", "the operator sees the orders")
}

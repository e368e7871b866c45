package dev_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestStartStop runs `onceflow dev` as its command does, on a local cluster
// and on free ports, and checks that Stop leaves nothing behind.
func TestStartStop(t *testing.T) {
	// The temporary directories of dev and its cluster go here, to be
	// counted; traversable by the postgres user when running as root.
	// (t.TempDir is not: its parent is private.)
	tmp, err := os.MkdirTemp("", "devtest-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o755))
	t.Setenv("TMPDIR", tmp)
	ctx := t.Context()

	e, err := dev.Start(ctx, dev.Config{}, testLogger(t))
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, e.Stop(context.Background()))
		}
	})

	require.Len(t, e.Services, len(registry.Names()))
	for i, name := range registry.Names() { // order, payment, inventory, notify, then any added
		s := e.Services[i]
		require.Equal(t, name, s.Name)
		require.Equal(t, s.URL, e.URL(name))
		require.True(t, strings.HasPrefix(s.URL, "http://127.0.0.1:"), s.URL)
		require.Contains(t, s.DatabaseURL, "/onceflow_"+name+"?")
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := client(t).Get(s.URL + path)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, name+path)
		}
	}
	require.Empty(t, e.URL("shipping"))
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Len(t, entries, 3, "a NATS store, this run's NATS credentials and a cluster directory")
	nc, err := nats.Connect(e.NATSURL, nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
	}
	require.Error(t, err, "an anonymous connection to dev's NATS is refused")
	nc, err = nats.Connect(e.NATSURL, append(natsauth.Client{Creds: e.NATSCreds[streams.Operator]}.Options(streams.Operator), nats.MaxReconnects(0))...)
	require.NoError(t, err, "the operator's credentials are accepted")
	nc.Close()

	select {
	case <-e.Done():
		t.Fatal("Done before Stop")
	default:
	}
	require.NoError(t, e.Stop(context.Background()))
	stopped = true
	<-e.Done()
	require.NoError(t, e.Wait())
	require.NoError(t, e.Stop(context.Background()), "a second Stop")

	for _, s := range e.Services {
		_, err := client(t).Get(s.URL + "/healthz")
		require.Error(t, err, "%s still serving", s.Name)
	}
	natsURL, err := url.Parse(e.NATSURL)
	require.NoError(t, err)
	_, err = net.DialTimeout("tcp", natsURL.Host, time.Second)
	require.Error(t, err, "NATS still listening")
	dbURL, err := url.Parse(e.Services[0].DatabaseURL)
	require.NoError(t, err)
	_, err = net.DialTimeout("tcp", dbURL.Host, time.Second)
	require.Error(t, err, "PostgreSQL still listening")
	entries, err = os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries, "Stop left directories behind")
}

// TestStartFailsCleanly starts dev on an HTTP port in use: Start fails,
// saying which, and leaves nothing behind.
func TestStartFailsCleanly(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { busy.Close() })
	port := busy.Addr().(*net.TCPAddr).Port

	_, err = dev.Start(t.Context(), dev.Config{Ports: dev.Ports{Inventory: port}}, testLogger(t))
	require.ErrorContains(t, err, fmt.Sprintf("inventory API on 127.0.0.1:%d", port))

	_, err = dev.Start(t.Context(), dev.Config{Ports: dev.Ports{NATS: port}}, testLogger(t))
	require.ErrorContains(t, err, fmt.Sprintf("nats on 127.0.0.1:%d", port))
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// onServer configures dev for the test PostgreSQL server (DATABASE_URL
// mode), in databases of its own that are dropped when the test ends.
func onServer(t *testing.T, name string) dev.Config {
	t.Helper()
	admin := testenv.NewDatabase(t, postgres.Schema{}).AdminURL()
	prefix := fmt.Sprintf("dev%d_%s_", os.Getpid(), name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer conn.Close(ctx)
		for _, name := range registry.Names() {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{prefix + name}.Sanitize()+" WITH (FORCE)")
			require.NoError(t, err)
		}
	})
	return dev.Config{DatabaseURL: admin, DatabasePrefix: prefix}
}

// TestSaga runs the whole saga through the HTTP APIs: an order that is
// confirmed, one rejected for funds, and one cancelled for stock and
// refunded.
func TestSaga(t *testing.T) {
	t.Parallel()
	e, err := dev.Start(t.Context(), onServer(t, "saga"), testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	seeded, err := dev.Seed(t.Context(), e)
	require.NoError(t, err)
	require.Equal(t, dev.Seeded{
		Wallets: []dev.Wallet{{CustomerID: "alice", BalanceCents: 100_000}, {CustomerID: "bob", BalanceCents: 5_000}},
		Stock:   []dev.StockItem{{SKU: "apple", Available: 100}, {SKU: "pear", Available: 50}, {SKU: "plum", Available: 0}},
		Products: []dev.Product{
			{SKU: "apple", Name: "Apple", UnitPriceCents: 120},
			{SKU: "pear", Name: "Pear", UnitPriceCents: 1_000},
			{SKU: "plum", Name: "Plum", UnitPriceCents: 500},
		},
	}, seeded)

	confirmed := placeOrder(t, e, "alice", "apple", 3) // at the catalog's 120
	rejected := placeOrder(t, e, "bob", "pear", 10)    // 10 × 1000 > 5000
	cancelled := placeOrder(t, e, "alice", "plum", 1)

	requireStatus(t, e, confirmed, "CONFIRMED")
	requireStatus(t, e, rejected, "REJECTED")
	requireStatus(t, e, cancelled, "CANCELLED")
	// The refund of the cancelled order comes after the cancellation.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var w dev.Wallet
		getJSON(c, e, e.URL("payment")+"/wallets/alice", &w)
		require.Equal(c, int64(100_000-360), w.BalanceCents)
	}, 30*time.Second, 50*time.Millisecond)

	var w dev.Wallet
	getJSON(t, e, e.URL("payment")+"/wallets/bob", &w)
	require.Equal(t, int64(5_000), w.BalanceCents)
	for sku, want := range map[string]int64{"apple": 97, "pear": 50, "plum": 0} {
		var s dev.StockItem
		getJSON(t, e, e.URL("inventory")+"/stock/"+sku, &s)
		require.Equal(t, want, s.Available, sku)
	}
}

// TestReuseDatabases starts dev twice on the same databases: the second run
// finds them, and seeding again replays the credits and stock receipts
// instead of adding them.
func TestReuseDatabases(t *testing.T) {
	t.Parallel()
	cfg := onServer(t, "reuse")
	for range 2 {
		e, err := dev.Start(t.Context(), cfg, testLogger(t))
		require.NoError(t, err)
		_, err = dev.Seed(t.Context(), e)
		require.NoError(t, err)
		var w dev.Wallet
		getJSON(t, e, e.URL("payment")+"/wallets/alice", &w)
		require.Equal(t, int64(100_000), w.BalanceCents)
		for sku, want := range map[string]int64{"apple": 100, "plum": 0} {
			var s dev.StockItem
			getJSON(t, e, e.URL("inventory")+"/stock/"+sku, &s)
			require.Equal(t, want, s.Available, sku)
		}
		require.NoError(t, e.Stop(context.Background()))
	}
}

type order struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

func placeOrder(t *testing.T, e *dev.Env, customer, sku string, quantity int) string {
	t.Helper()
	body := fmt.Sprintf(`{"customer_email":"%s@example.com","items":[{"sku":%q,"quantity":%d}]}`, customer, sku, quantity)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.URL("order")+"/orders", bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", t.Name()+"-"+customer+"-"+sku)
	tok, err := e.Token(customer, false)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client(t).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var o order
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	require.NotEmpty(t, o.ID)
	return o.ID
}

func requireStatus(t *testing.T, e *dev.Env, id, want string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var o order
		getJSON(c, e, e.URL("order")+"/orders/"+id, &o)
		require.Equal(c, want, o.Status)
	}, 30*time.Second, 50*time.Millisecond, "order %s", id)
}

// getJSON GETs url as an operator of e and decodes the answer into out.
func getJSON(t require.TestingT, e *dev.Env, url string, out any) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	tok, err := e.Token("dev-test", true)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
}

// client is an HTTP client that keeps no connections open after the test.
func client(t *testing.T) *http.Client {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// TestStopWithConnectionsLeftOpen leaves connections open on the issuer and
// on a service, as clients do: one that connected and sent nothing, one
// whose request stalls half-way through its body (active for as long as
// the client likes), and an idle keep-alive connection. Stop returns
// cleanly all the same, within a bound: the services' grace
// (SHUTDOWN_TIMEOUT, 2s here) and then the issuer's (5s), never waiting on
// a client.
func TestStopWithConnectionsLeftOpen(t *testing.T) {
	t.Parallel()
	cfg := onServer(t, "open")
	cfg.Environ = []string{"SHUTDOWN_TIMEOUT=2s"}
	e, err := dev.Start(t.Context(), cfg, testLogger(t))
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = e.Stop(context.Background())
		}
	})

	keepAlive := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(keepAlive.CloseIdleConnections)
	for _, target := range []struct{ base, post string }{
		{e.IssuerURL, "/token"},
		{e.URL("order"), "/orders"},
	} {
		u, err := url.Parse(target.base)
		require.NoError(t, err)
		silent, err := net.Dial("tcp", u.Host)
		require.NoError(t, err)
		t.Cleanup(func() { silent.Close() })
		stalled, err := net.Dial("tcp", u.Host)
		require.NoError(t, err)
		t.Cleanup(func() { stalled.Close() })
		_, err = fmt.Fprintf(stalled, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nsub=", target.post, u.Host)
		require.NoError(t, err)
		resp, err := keepAlive.Get(target.base + "/healthz")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close() // the connection goes back to the client's pool, open
	}

	start := time.Now()
	require.NoError(t, e.Stop(context.Background()))
	stopped = true
	took := time.Since(start)
	t.Logf("Stop took %s", took)
	require.Less(t, took, 4*(2+5)*time.Second, "Stop is bounded by the graces, not by the clients")
	require.NoError(t, e.Wait())
}

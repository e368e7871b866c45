package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	operatorToken = "operator-secret"
	waitFor       = time.Minute
)

// system is onceflow dev, seeded, and its console.
type system struct {
	env     *dev.Env
	console string // base URL
	pools   map[string]*pgxpool.Pool
	js      jetstream.JetStream
}

// start runs onceflow dev, its services given environ besides the
// defaults, and the console.
func start(t *testing.T, environ ...string) *system {
	t.Helper()
	ctx := t.Context()
	devCfg := onServer(t)
	devCfg.Environ = environ
	e, err := dev.Start(ctx, devCfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	_, err = dev.Seed(ctx, e)
	require.NoError(t, err)
	s := &system{env: e, pools: map[string]*pgxpool.Pool{}}
	// Operators sign in with the services' JWTs (role admin) or the shared
	// token.
	verifier, err := auth.NewVerifier(ctx, e.AuthConfig(), testLogger(t))
	require.NoError(t, err)
	cfg := console.Config{
		Audit: audit.Config{NATSURL: e.NATSURL, NATSCreds: e.NATSCreds[streams.Operator]},
		Auth:  console.AnyOf{console.TokenAuth{Token: operatorToken, Name: "ops"}, console.JWTAuth{Verifier: verifier}},
		Live:  200 * time.Millisecond,
	}
	for _, svc := range e.Services {
		pool, err := postgres.Connect(ctx, svc.DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s.pools[svc.Name] = pool
		*map[string]*string{"order": &cfg.Audit.OrderURL, "payment": &cfg.Audit.PaymentURL, "inventory": &cfg.Audit.InventoryURL, "notify": &cfg.Audit.NotifyURL}[svc.Name] = svc.DatabaseURL
	}
	// With every right (dev.Config.TestAdmin), to corrupt on purpose.
	nc, err := nats.Connect(e.NATSURL, natsauth.Client{Creds: e.NATSCreds[natsauth.Admin]}.Options(natsauth.Admin)...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	s.js, err = jetstream.New(nc)
	require.NoError(t, err)

	srv, err := console.New(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serveCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	s.console = "http://" + ln.Addr().String()
	return s
}

// systemSeq numbers the systems of this test binary.
var systemSeq atomic.Int64

// onServer runs dev's databases on the test environment's PostgreSQL.
func onServer(t *testing.T) dev.Config {
	t.Helper()
	admin := testenv.NewDatabase(t, postgres.Schema{}).AdminURL()
	// Per system: the browser tests run in parallel.
	prefix := fmt.Sprintf("console%d_%d_", os.Getpid(), systemSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer conn.Close(ctx)
		for _, name := range []string{"order", "payment", "inventory", "notify"} {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{prefix + name}.Sanitize()+" WITH (FORCE)")
			require.NoError(t, err)
		}
	})
	return dev.Config{DatabaseURL: admin, DatabasePrefix: prefix, TestAdmin: true}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// placeOrder places an order and returns its id, without waiting for it.
func (s *system) placeOrder(t *testing.T, customer, items string) string {
	t.Helper()
	body := fmt.Sprintf(`{"customer_email":"%s@example.com","items":[%s]}`, customer, items)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.env.URL("order")+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("console-%d", time.Now().UnixNano()))
	tok, err := s.env.Token(customer, false)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var o struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	return o.ID
}

func (s *system) exec(t *testing.T, service, sql string, args ...any) {
	t.Helper()
	_, err := s.pools[service].Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// needsBrowser skips t in the -short tier, which starts no browser; a
// browser test calls it before it starts its system.
func needsBrowser(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: drives a headless Chromium")
	}
}

// browser starts a headless Chromium with a fresh profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "the browser tests need Debian's chromium (apt-get install chromium)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// The browser lives as long as the context of its first action.
	require.NoError(t, chromedp.Do(ctx))
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(cancelTimeout)
	return ctx
}

// screenshot saves the page as name under ONCEFLOW_SCREENSHOTS, when set
// (docs/ holds the README's).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("ONCEFLOW_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
}

// textOf returns the text of the first element sel matches.
func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	// Read by script: a live view replaces nodes that a DOM query may hold.
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q)?.textContent ?? ""`, sel)))
	require.NoError(t, err)
	return strings.TrimSpace(text)
}

// awaitText waits until the element sel matches contains want, the page
// updating itself.
func awaitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	// A poll started while a form's answer loads ends with the page it
	// polled ("navigated", "cannot find context"): poll again on the new
	// one.
	deadline := time.Now().Add(waitFor)
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
			fmt.Sprintf(`(document.querySelector(%q)?.textContent ?? "").includes(%q)`, sel, want),
			chromedp.WithPollingTimeout(5*time.Second)))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			require.NoError(t, err, "%s never showed %q", sel, want)
		}
	}
}

// TestConsoleInABrowser is shown the sign-in page, and nothing else,
// without an operator's token and with a customer's; signs in as an
// operator, places an order and watches its lanes fill in, makes an event
// fail for good and finds it on the DLQ page, sees a dead letter's markup
// as text, replays the entry, sees the order finish and the entry marked
// replayed, and runs the audit.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	needsBrowser(t)
	s := start(t)
	ctx := browser(t)

	// A stranger, and a customer with a token the services accept, see
	// the sign-in page wherever they go, and nothing of the system.
	id := s.placeOrder(t, "alice", `{"sku":"apple","quantity":3}`) // at the seeded 120
	for _, path := range []string{"/", "/orders", "/orders?q=alice", "/orders/" + id, "/orders/" + id + "/saga", "/pipeline", "/dlq", "/dlq/1", "/audit"} {
		s.requireSignInPage(t, ctx, path)
	}
	alice, err := s.env.Token("alice", false)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, network.SetCookie, network.SetCookieParams{Name: "onceflow_console_session", Value: alice, URL: s.console})
		return err
	})))
	s.requireSignInPage(t, ctx, "/orders/"+id)

	// An operator signs in with an admin token and goes on to the page
	// they asked for: the order's lanes fill in while its saga runs.
	s.signIn(t, ctx, "/orders/"+id)
	awaitText(t, ctx, "#order-status", "CONFIRMED")
	awaitText(t, ctx, "#saga", "the saga is over")
	hops, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#saga svg g.hop:not(.pending)").length`))
	require.NoError(t, err)
	require.Equal(t, 6, hops, "OrderPlaced to payment and notify, PaymentDebited to inventory and order, StockReserved to order, OrderConfirmed to notify")
	for _, lane := range []string{"order", "payment", "inventory", "notify", "PaymentDebited", "StockReserved", "OrderConfirmed", " ms"} {
		require.Contains(t, textOf(t, ctx, "#saga"), lane)
	}
	screenshot(t, ctx, "console-order.png")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/orders?q=alice")))
	require.Contains(t, textOf(t, ctx, "#orders"), id)

	entry, order := s.poison(t)

	// The DLQ page lists it with its reason; the order's page links to it.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/orders/"+order)))
	awaitText(t, ctx, "#order-status", "PAID")
	require.Contains(t, textOf(t, ctx, "#saga"), "not processed")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`a[href^="/dlq?order="]`))))
	awaitText(t, ctx, "#dlq", "which has no payment")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/dlq?status=open")))
	require.Contains(t, textOf(t, ctx, "#dlq"), "which has no payment")
	require.Contains(t, textOf(t, ctx, "#dlq"), streams.PaymentInventory)
	screenshot(t, ctx, "console-dlq.png")

	// A dead letter's payload and headers are shown as text, never as
	// markup (stored XSS for whoever opens the page).
	s.requireShownAsText(t, ctx)

	// The operator replays it: the order finishes.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/dlq/%d", s.console, entry)),
		chromedp.WaitVisible(chromedp.CSS("#replay")),
		chromedp.Click(chromedp.CSS("#replay"))))
	awaitText(t, ctx, "#flash", "replayed")
	require.Equal(t, "replayed", textOf(t, ctx, "#entry-status"))
	require.Contains(t, textOf(t, ctx, "#actions"), "ops")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/orders/"+order)))
	awaitText(t, ctx, "#order-status", "CANCELLED")
	awaitText(t, ctx, "#saga", "PaymentRefunded")

	// Charged once, refunded once: the auditor agrees.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/pipeline")))
	require.Contains(t, textOf(t, ctx, "#consumers"), streams.PaymentInventory)
	report, err := audit.Run(t.Context(), audit.Config{
		OrderURL: s.env.Services[0].DatabaseURL, PaymentURL: s.env.Services[1].DatabaseURL,
		InventoryURL: s.env.Services[2].DatabaseURL, NotifyURL: s.env.Services[3].DatabaseURL,
		NATSURL: s.env.NATSURL, NATSCreds: s.env.NATSCreds[streams.Operator], Wait: waitFor,
	}, testLogger(t))
	require.NoError(t, err)
	require.True(t, report.OK(), "%+v", report.Failed())
	// The audit runs when the operator posts its form; the page alone
	// (any other site's <img> could load it) runs nothing.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+"/audit?run=1")))
	require.Empty(t, textOf(t, ctx, "#checks"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#run"))))
	awaitText(t, ctx, "h2", " checks hold")
	require.True(t, strings.HasPrefix(textOf(t, ctx, "h2"), "All "), textOf(t, ctx, "#checks"))
}

// poison makes payment give up, for good, on the StockRejected of a new
// order of plums (out of stock): while inventory waits for a lock on its
// stock, the order's payment row is moved aside, so that the refund finds
// no payment (a permanent error: dead-lettered at once); the row is put
// back once it is in the DLQ, as a fix would. The customer is charged and
// the order PAID until the entry is replayed. It returns the entry and the
// order.
func (s *system) poison(t *testing.T) (entry uint64, order string) {
	t.Helper()
	ctx := t.Context()
	lock, err := s.pools["inventory"].Begin(ctx)
	require.NoError(t, err)
	// Released before the pools close (which would wait for it) even if
	// an assertion below stops the test.
	t.Cleanup(func() { _ = lock.Rollback(context.WithoutCancel(ctx)) })
	_, err = lock.Exec(ctx, `LOCK TABLE stock IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	order = s.placeOrder(t, "alice", `{"sku":"plum","quantity":1}`)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, s.pools["payment"].QueryRow(ctx, `SELECT count(*) FROM payments WHERE order_id = $1`, order).Scan(&n))
		return n == 1
	}, waitFor, 20*time.Millisecond)
	s.exec(t, "payment", `CREATE TABLE payments_aside AS SELECT * FROM payments WHERE order_id = $1`, order)
	s.exec(t, "payment", `DELETE FROM payments WHERE order_id = $1`, order)
	require.NoError(t, lock.Rollback(ctx))

	store := dlq.New(s.js, dlq.Config{Topology: streams.Saga(streams.Config{})})
	require.Eventually(t, func() bool {
		page, err := store.List(ctx, dlq.Filter{Consumer: streams.PaymentInventory})
		require.NoError(t, err)
		for _, e := range page.Entries {
			if e.OrderID == order {
				entry = e.ID
				return true
			}
		}
		return false
	}, waitFor, 20*time.Millisecond)
	s.exec(t, "payment", `INSERT INTO payments SELECT * FROM payments_aside`)
	s.exec(t, "payment", `DROP TABLE payments_aside`)
	return entry, order
}

// signIn goes to path as an operator with an admin token: through the
// sign-in page, on to path.
func (s *system) signIn(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	admin, err := s.env.Token("ops", true)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(s.console+path),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), admin),
		chromedp.Click(chromedp.CSS("#signin"))))
}

// requireSignInPage navigates to path and requires the sign-in page
// instead, which brings the browser back to path, showing nothing else.
func (s *system) requireSignInPage(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(s.console+path), chromedp.WaitVisible(chromedp.CSS("#signin"))))
	at, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, s.console+"/login?next="+url.QueryEscape(path), at)
	main := textOf(t, ctx, "main")
	require.True(t, strings.HasPrefix(main, "Operator"), "%s: %s", path, main)
	for _, secret := range []string{"alice@example.com", "CONFIRMED", streams.PaymentInventory, "checks hold"} {
		require.NotContains(t, main, secret, path)
	}
}

// requireShownAsText dead-letters an event whose payload, reason and
// headers are markup and requires its page to show them as text: no
// element of theirs in the page, no script of theirs run.
func (s *system) requireShownAsText(t *testing.T, ctx context.Context) {
	t.Helper()
	// No double quotes: the payload stays valid JSON, shown as it is.
	const markup = `<img id='xss-img' src='x' onerror='document.title=/pwned/.source'><b id='xss-b'>bold</b><script>document.title=/pwned/.source</script>`
	msg := nats.NewMsg(streams.DLQSubjectPrefix + streams.PaymentInventory)
	msg.Header.Set(inbox.HeaderDLQReason, markup)
	msg.Header.Set(inbox.HeaderDLQConsumer, streams.PaymentInventory)
	msg.Header.Set("X-Markup", markup)
	msg.Data = []byte(`{"order_id":"` + markup + `","note":"</pre>` + markup + `"}`)
	ack, err := s.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/dlq/%d", s.console, ack.Sequence)), chromedp.WaitVisible(chromedp.CSS("main"))))
	injected, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#xss-img, #xss-b").length`))
	require.NoError(t, err)
	require.Zero(t, injected, "elements of the dead letter's markup in the page")
	title, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.title`))
	require.NoError(t, err)
	require.NotEqual(t, "pwned", title)
	require.Contains(t, textOf(t, ctx, "pre"), `<b id='xss-b'>bold</b>`, "the payload shown as text")
	require.Contains(t, textOf(t, ctx, "#reason"), `<b id='xss-b'>bold</b>`, "the reason shown as text")
}

package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/httpserve"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

//go:embed templates/*.html
var templateFS embed.FS

// Config says what the console reads and who may act.
type Config struct {
	// Audit names the four databases and NATS, as the auditor reads them.
	Audit audit.Config
	// Auth decides who is an operator; nil lets nobody replay or discard.
	Auth Authorizer
	// AuthHint tells the sign-in page where an operator's token comes from.
	AuthHint string
	// Live is how often live views poll; default 1s.
	Live time.Duration
	// Hosts are the Host headers the console answers ("name" for any
	// port, or "name:port"); default its listening address and, on a
	// loopback or unspecified address, localhost, 127.0.0.1 and [::1] with
	// its port. Others are refused: a DNS-rebinding page would otherwise
	// be "same origin".
	Hosts []string
	// SessionTTL bounds a sign-in: its session (kept by the console, the
	// cookie holding only its id) ends then, or with the token if sooner;
	// default 12h. Signing out ends it at once.
	SessionTTL time.Duration
	// SecureCookie marks the sign-in cookie Secure although the console
	// does not serve TLS itself (behind a TLS-terminating proxy); it is
	// marked Secure on a request that came over TLS in any case.
	SecureCookie bool
}

// Server serves the console. Close it when done.
type Server struct {
	cfg      Config
	logger   *slog.Logger
	pools    map[string]*pgxpool.Pool // per service
	nc       *nats.Conn
	js       jetstream.JetStream
	dlq      *dlq.Store
	topology streams.Topology
	pages    map[string]*template.Template
	sessions *sessions
}

// services are the lanes of the saga, in order.
var services = []string{"order", "payment", "inventory", "notify"}

// New connects to the databases and NATS of cfg.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Server, err error) {
	cfg.Live = cmp.Or(cfg.Live, time.Second)
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, 12*time.Hour)
	s := &Server{cfg: cfg, logger: logger, pools: map[string]*pgxpool.Pool{}, topology: streams.Saga(streams.Config{})}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	urls := map[string]string{"order": cfg.Audit.OrderURL, "payment": cfg.Audit.PaymentURL, "inventory": cfg.Audit.InventoryURL, "notify": cfg.Audit.NotifyURL}
	for _, name := range services {
		if urls[name] == "" {
			return nil, fmt.Errorf("console: no database URL for %s", name)
		}
		pool, err := postgres.Connect(ctx, urls[name], func(pc *pgxpool.Config) { pc.MaxConns = 4 })
		if err != nil {
			return nil, fmt.Errorf("console: %s database: %w", name, err)
		}
		s.pools[name] = pool
	}
	client := natsauth.Client{URL: cfg.Audit.NATSURL, Creds: cfg.Audit.NATSCreds, TLSCA: cfg.Audit.NATSTLSCA}
	if s.nc, err = nats.Connect(client.URL, append(client.Options(streams.Operator), nats.Name("onceflow-console"), nats.MaxReconnects(-1))...); err != nil {
		return nil, fmt.Errorf("console: connect to nats: %w", err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		return nil, fmt.Errorf("console: jetstream: %w", err)
	}
	s.dlq = dlq.New(s.js, dlq.Config{Topology: s.topology})
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if s.sessions, err = newSessions(maxSessions, time.Now); err != nil {
		return nil, err
	}
	return s, nil
}

// Close closes the connections.
func (s *Server) Close() {
	for _, p := range s.pools {
		p.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
}

// Handler is the console's HTTP handler, answering the Host headers
// hosts (Config.Hosts, when set, instead). Every page but /healthz and the
// sign-in needs an operator.
func (s *Server) Handler(hosts ...string) http.Handler {
	if len(s.cfg.Hosts) > 0 {
		hosts = s.cfg.Hosts
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorPage
	e.Use(s.guard(hosts))
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	e.GET("/login", s.loginPage)
	e.POST("/login", s.login)
	e.POST("/logout", s.logout)

	op := s.signedIn
	e.GET("/", func(c echo.Context) error { return c.Redirect(http.StatusSeeOther, "/orders") }, op)
	e.GET("/orders", s.ordersPage, op)
	e.GET("/orders/rows", s.ordersRows, op)
	e.GET("/orders/:id", s.orderPage, op)
	e.GET("/orders/:id/saga", s.orderSaga, op)
	e.GET("/pipeline", s.pipelinePage, op)
	e.GET("/pipeline/rows", s.pipelineRows, op)
	e.GET("/dlq", s.dlqPage, op)
	e.GET("/dlq/:id", s.dlqEntryPage, op)
	e.POST("/dlq/:id/replay", s.dlqReplay, s.operator)
	e.POST("/dlq/:id/discard", s.dlqDiscard, s.operator)
	e.GET("/audit", s.auditPage, op)
	e.POST("/audit", s.auditRun, s.operator)
	return e
}

// Serve serves the console on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(defaultHosts(ln.Addr())...), ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 2 * time.Minute}
	if err := httpserve.Serve(ctx, srv, ln, 5*time.Second, s.logger); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}

// render renders page with data in the layout, or only its fragment
// ("rows", "saga") when fragment is set.
func (s *Server) render(c echo.Context, status int, page string, data map[string]any) error {
	t, ok := s.pages[page]
	if !ok {
		return fmt.Errorf("console: no page %s", page)
	}
	data["Page"] = page
	data["Live"] = s.cfg.Live.Milliseconds()
	data["Nonce"] = c.Get(nonceKey)
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextHTMLCharsetUTF8)
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().WriteHeader(status)
	return t.ExecuteTemplate(c.Response(), "layout", data)
}

// renderFragment renders the named template of page alone.
func (s *Server) renderFragment(c echo.Context, page, name string, data map[string]any) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextHTMLCharsetUTF8)
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().WriteHeader(http.StatusOK)
	return s.pages[page].ExecuteTemplate(c.Response(), name, data)
}

// errorPage renders an error: HTTP errors as they are, others as a bare
// 500, logged.
func (s *Server) errorPage(err error, c echo.Context) {
	// An HTTP error's message is the console's own words; any other error
	// is logged and the browser learns only that it happened.
	status, msg := http.StatusInternalServerError, "internal error"
	var he *echo.HTTPError
	if errors.As(err, &he) {
		status, msg = he.Code, fmt.Sprint(he.Message)
	} else {
		s.logger.ErrorContext(c.Request().Context(), "console request failed", "path", c.Request().URL.Path, "err", err)
	}
	if c.Response().Committed {
		return
	}
	if err := s.render(c, status, "error", map[string]any{"Status": status, "Message": msg}); err != nil {
		s.logger.ErrorContext(c.Request().Context(), "console error page failed", "err", err)
	}
}

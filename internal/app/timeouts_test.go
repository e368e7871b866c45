package app_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A flood waits a bounded time: with the HTTP pool's one connection held
// by a slow statement, another request is refused with a 503 and a
// Retry-After once DATABASE_ACQUIRE_TIMEOUT has passed, and the slow
// statement is cancelled by DATABASE_STATEMENT_TIMEOUT, also a 503.
func TestABusyDatabaseIsA503(t *testing.T) {
	t.Parallel()
	nt := testenv.NewNATS(t)
	db := testenv.NewServiceDatabase(t, "payment")
	_, issuerURL := apptest.StartIssuer(t)
	const statementTimeout, acquireTimeout = 3 * time.Second, 300 * time.Millisecond
	cfg, err := env.ParseAsWithOptions[app.Config](env.Options{Environment: map[string]string{
		"DATABASE_URL":               db.URL,
		"DATABASE_MAX_CONNS":         "1",
		"DATABASE_STATEMENT_TIMEOUT": statementTimeout.String(),
		"DATABASE_ACQUIRE_TIMEOUT":   acquireTimeout.String(),
		"NATS_URL":                   nt.URL,
		"NATS_CREDS":                 nt.Client("payment").Creds,
		"AUTH_JWKS_URL":              issuerURL + auth.JWKSPath,
		"AUTH_ISSUER":                issuerURL,
		"SHUTDOWN_TIMEOUT":           "10s",
	}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.HTTPListener = ln
	build := func(deps app.Deps) (app.Spec, error) {
		return app.Spec{
			Routes: func(e *echo.Echo) {
				e.GET("/slow", func(c echo.Context) error {
					if _, err := deps.Pool.Exec(c.Request().Context(), "SELECT pg_sleep(60)"); err != nil {
						return err
					}
					return c.NoContent(http.StatusNoContent)
				})
				e.GET("/quick", func(c echo.Context) error {
					if _, err := deps.Pool.Exec(c.Request().Context(), "SELECT 1"); err != nil {
						return err
					}
					return c.NoContent(http.StatusNoContent)
				})
			},
			Public: []string{"GET /slow", "GET /quick"},
		}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, "payment", cfg, slog.New(slog.DiscardHandler), build) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second}
	type answer struct {
		resp    *http.Response
		err     error
		elapsed time.Duration
	}
	get := func(path string) answer {
		began := time.Now()
		resp, err := client.Get(base + path)
		if err == nil {
			resp.Body.Close()
		}
		return answer{resp, err, time.Since(began)}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := client.Get(base + "/quick")
		require.NoError(c, err)
		resp.Body.Close()
		require.Equal(c, http.StatusNoContent, resp.StatusCode)
	}, 20*time.Second, 20*time.Millisecond)

	slow := make(chan answer, 1)
	go func() { slow <- get("/slow") }()
	require.Eventually(t, func() bool {
		var n int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND query = 'SELECT pg_sleep(60)'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the slow statement holds the pool's one connection")

	a := get("/quick")
	require.NoError(t, a.err)
	require.Equal(t, http.StatusServiceUnavailable, a.resp.StatusCode, "no connection free within the acquire timeout")
	require.Equal(t, httpapi.ContentTypeProblem, a.resp.Header.Get(echo.HeaderContentType))
	require.Equal(t, "1", a.resp.Header.Get(echo.HeaderRetryAfter))
	require.GreaterOrEqual(t, a.elapsed, acquireTimeout)
	require.Less(t, a.elapsed, statementTimeout, "refused before the slow statement ended")

	a = <-slow
	require.NoError(t, a.err)
	require.Equal(t, http.StatusServiceUnavailable, a.resp.StatusCode, "the statement timeout cancels the slow statement")
	require.Equal(t, "1", a.resp.Header.Get(echo.HeaderRetryAfter))
	require.GreaterOrEqual(t, a.elapsed, statementTimeout)
	require.Less(t, a.elapsed, 20*time.Second)

	a = get("/quick")
	require.NoError(t, a.err)
	require.Equal(t, http.StatusNoContent, a.resp.StatusCode, "the connection is free again")
}

package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// A service started before `onceflow provision` waits for its durables,
// and its /readyz says so, instead of failing.
func TestAServiceWaitsForProvisioning(t *testing.T) {
	t.Parallel()
	nt := testenv.NewNATS(t)
	db := testenv.NewServiceDatabase(t, "payment")
	_, issuerURL := apptest.StartIssuer(t)
	cfg, err := env.ParseAsWithOptions[app.Config](env.Options{Environment: map[string]string{
		"AUTH_JWKS_URL":    issuerURL + auth.JWKSPath,
		"AUTH_ISSUER":      issuerURL,
		"DATABASE_URL":     db.URL,
		"NATS_URL":         nt.URL,
		"NATS_CREDS":       nt.Client("payment").Creds,
		"SHUTDOWN_TIMEOUT": "10s",
	}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.HTTPListener = ln
	build := func(app.Deps) (app.Spec, error) {
		return app.Spec{Subscriptions: []app.Subscription{{
			Durable: streams.PaymentOrders,
			Handler: func(context.Context, pgx.Tx, event.Envelope) error { return nil },
		}}}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, "payment", cfg, slog.New(slog.DiscardHandler), build) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the service did not stop")
		}
	})

	readyz := func() (int, string) {
		resp, err := http.Get("http://" + ln.Addr().String() + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	require.Eventually(t, func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for `onceflow provision`")
	}, 20*time.Second, 20*time.Millisecond)

	require.NoError(t, natsauth.Provision(t.Context(), nt.Client(streams.Provisioner), streams.Saga(streams.Config{})))
	require.Eventually(t, func() bool {
		code, _ := readyz()
		return code == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the service stopped: %v", err)
	default:
	}
}

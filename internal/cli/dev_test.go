package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDev runs `onceflow dev --seed` on free ports until the signal (here:
// the context) ends it, as a user would with Ctrl-C.
func TestDev(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	require.NoError(t, os.Unsetenv("DATABASE_URL")) // a local cluster
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"dev", "--seed", "--http-port", "0", "--nats-port", "0", "--console-port", "0"}, &stdout, &stderr)
	}()

	var returned bool
	var early error
	require.Eventually(t, func() bool {
		select {
		case early = <-done:
			returned = true
			return true
		default:
		}
		return strings.Contains(stdout.String(), "Press Ctrl-C to stop.")
	}, 2*time.Minute, 50*time.Millisecond)
	require.False(t, returned, "dev returned early: %v\n%s\n%s", early, stdout.String(), stderr.String())
	out := stdout.String()
	for _, want := range []string{
		"onceflow dev is running:",
		"  order      http://127.0.0.1:",
		"/onceflow_notify?sslmode=disable",
		"  nats       nats://127.0.0.1:",
		"  console    http://127.0.0.1:",
		"temporary: removed on exit",
		"Seeded wallets: alice 100000 cents, bob 5000 cents.",
		"Seeded stock:   apple 100, pear 50, plum 0.",
		"Seeded prices:  apple 120 cents, pear 1000 cents, plum 500 cents",
		"-H 'Idempotency-Key: demo-1'",
		"/token -d sub=carol",
		"  export ALICE=ey",
		"  export BOB=ey",
		"  export ADMIN=ey",
		`-H "Authorization: Bearer $ALICE"`,
	} {
		require.Contains(t, out, want)
	}
	// A customer's token carries the e-mail an order defaults to.
	alice := regexp.MustCompile(`export ALICE=[^.]+\.([^.]+)\.`).FindStringSubmatch(out)
	require.Len(t, alice, 2)
	claims, err := base64.RawURLEncoding.DecodeString(alice[1])
	require.NoError(t, err)
	require.Contains(t, string(claims), `"email":"alice@example.com"`)
	requireAdminTokenForThePrintedSecret(t, out)
	requireSeedIsAReplay(t, out)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("dev did not stop")
	}
	require.True(t, strings.HasSuffix(stdout.String(), "Stopped; its temporary data is removed.\n"), stdout.String())
}

// requireAdminTokenForThePrintedSecret asks the issuer dev printed for an
// admin token as the printed curl does: refused without the printed
// OPERATOR_SECRET, given with it; a customer's needs none.
func requireAdminTokenForThePrintedSecret(t *testing.T, out string) {
	t.Helper()
	issuer := regexp.MustCompile(`(?m)^  issuer\s+(http://\S+)`).FindStringSubmatch(out)
	require.Len(t, issuer, 2, out)
	secret := regexp.MustCompile(`(?m)^  export OPERATOR_SECRET=(\S+)$`).FindStringSubmatch(out)
	require.Len(t, secret, 2, out)
	require.Contains(t, out, `/token -H "Authorization: Bearer $OPERATOR_SECRET" -d sub=ops -d role=admin`)
	token := func(form url.Values, bearer string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, issuer[1]+"/token", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	admin := url.Values{"sub": {"ops"}, "role": {"admin"}}
	require.Equal(t, http.StatusUnauthorized, token(admin, ""))
	require.Equal(t, http.StatusOK, token(admin, secret[1]))
	require.Equal(t, http.StatusOK, token(url.Values{"sub": {"carol"}, "email": {"carol@example.com"}}, ""))
}

// requireSeedIsAReplay runs `onceflow seed` (the compose demo's seed job)
// against the services dev printed, which dev --seed has seeded: it
// writes what dev --seed wrote, once (alice still has 100000 cents).
func requireSeedIsAReplay(t *testing.T, out string) {
	t.Helper()
	for _, name := range []string{"order", "payment", "inventory", "issuer"} {
		m := regexp.MustCompile(`(?m)^  ` + name + `\s+(http://\S+)`).FindStringSubmatch(out)
		require.Len(t, m, 2, out)
		t.Setenv(strings.ToUpper(name)+"_URL", m[1])
	}
	secret := regexp.MustCompile(`(?m)^  export OPERATOR_SECRET=(\S+)$`).FindStringSubmatch(out)
	require.Len(t, secret, 2, out)

	var stdout, stderr bytes.Buffer
	t.Setenv("ISSUER_OPERATOR_SECRET", "wrong")
	require.ErrorContains(t, Run(t.Context(), []string{"seed"}, &stdout, &stderr), "401", "an admin token without the issuer's secret")
	t.Setenv("ISSUER_OPERATOR_SECRET", secret[1])
	require.NoError(t, Run(t.Context(), []string{"seed"}, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "wallet alice: 100000 cents\n")
	require.Contains(t, stdout.String(), "stock apple: 100\n")
	require.Contains(t, stdout.String(), "price plum: 500 cents\n")
}

// onceflow dev warns unless it listens on a loopback address only.
func TestLoopback(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.0.0.2": true, "::1": true, "localhost": true, "": true,
		"0.0.0.0": false, "::": false, "192.168.1.5": false, "example.com": false,
	} {
		require.Equal(t, want, loopback(host), host)
	}
}

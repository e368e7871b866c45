package cli

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// onceflow issuer (compose's) takes its operator secret from the
// environment, logs it, and gives an admin token only for it.
func TestIssuerCommand(t *testing.T) {
	t.Setenv("ISSUER_ADDR", "127.0.0.1:0")
	t.Setenv("ISSUER_OPERATOR_SECRET", "s3cret-from-env")
	t.Setenv("LOG_FORMAT", "text")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"issuer"}, &stdout, &stderr) }()

	started := regexp.MustCompile(`dev token issuer started.* addr=(\S+)`)
	require.Eventually(t, func() bool { return started.MatchString(stderr.String()) }, time.Minute, 20*time.Millisecond)
	log := stderr.String()
	require.Contains(t, log, "operator_secret=s3cret-from-env")
	addr := started.FindStringSubmatch(log)[1]

	token := func(bearer string) int {
		form := url.Values{"sub": {"ops"}, "role": {"admin"}}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/token", strings.NewReader(form.Encode()))
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
	require.Equal(t, http.StatusUnauthorized, token(""))
	require.Equal(t, http.StatusUnauthorized, token("guess"))
	require.Equal(t, http.StatusOK, token("s3cret-from-env"))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the issuer did not stop")
	}
}

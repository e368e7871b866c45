package loadgen

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryWaitsAsLongAsRetryAfterAsks(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)

	c := &client{http: srv.Client(), tokens: map[caller]string{operator: "a-token"}}
	retried := 0
	start := time.Now()
	err := retry(t.Context(), func() { retried++ }, func() error {
		return c.do(t.Context(), operator, http.MethodPost, srv.URL, "k", map[string]int{"n": 1}, nil)
	})
	require.NoError(t, err)
	require.Equal(t, 1, retried)
	require.EqualValues(t, 2, calls.Load())
	// Without Retry-After the first retry would come after 50ms.
	require.GreaterOrEqual(t, time.Since(start), time.Second)
}

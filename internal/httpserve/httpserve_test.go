package httpserve_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/httpserve"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A stop with a client that never finishes its request ends once the
// grace is over: no sooner, since a request may finish in it, and within
// a small multiple of it, without an error.
func TestServeStopsWithinTheGrace(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	reading := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(reading)
		_, _ = r.Body.Read(make([]byte, 100)) // the body never comes
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, srv, ln, grace, nil) }()

	silent, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer silent.Close()
	stalled, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer stalled.Close()
	_, err = fmt.Fprintf(stalled, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	require.NoError(t, err)
	<-reading

	start := time.Now()
	stop()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(20 * grace):
		srv.Close() // so that the test ends
		t.Fatalf("still serving %s after the stop", 20*grace)
	}
	took := time.Since(start)
	require.GreaterOrEqual(t, took, grace, "a request in flight has the grace to finish")
	require.Less(t, took, 10*grace, "the stop is bounded by the grace")
	_, err = stalled.Read(make([]byte, 1))
	require.Error(t, err, "the stalled connection is closed")
}

// A server that cannot serve says so at once.
func TestServeReportsAFailure(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	err = httpserve.Serve(t.Context(), &http.Server{}, ln, time.Second, nil)
	require.ErrorIs(t, err, net.ErrClosed)
}

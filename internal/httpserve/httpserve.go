// Package httpserve runs an http.Server until its context ends and stops it
// within a bound, whatever its clients do: the one shutdown of every HTTP
// server onceflow runs (the services', the dev issuer's, the console's).
//
// http.Server.Shutdown waits for every connection to go idle, and counts
// as busy a client that connected and sent nothing yet (for about five
// seconds) or half a request (until ReadHeaderTimeout). A grace period that
// ends before they do must not make stopping fail: past it, Serve closes
// the connections left and returns as a clean stop.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Serve serves srv on ln until ctx ends, then shuts it down: it stops
// accepting, closes the idle connections and lets the requests in flight
// finish for up to grace; what is still open then is closed. It returns
// nil after a stop, however it ended, and an error only when serving
// failed. logger (may be nil) hears of the connections a stop cut.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration, logger *slog.Logger) error {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdown(context.WithoutCancel(ctx), srv, grace, logger)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// shutdown shuts srv down gracefully for up to grace (or until ctx ends),
// then closes the connections left: a grace that ran out is how such a
// stop ends, not a failure.
func shutdown(ctx context.Context, srv *http.Server, grace time.Duration, logger *slog.Logger) {
	sctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err == nil {
		return
	}
	if logger != nil {
		logger.Warn("http server: connections still open after the shutdown grace; closing them", "grace", grace, "err", err)
	}
	// Its only error is closing the listeners Shutdown has closed.
	_ = srv.Close()
}

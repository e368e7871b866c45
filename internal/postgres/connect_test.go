package postgres_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A server slower to answer a first connection than the pool's acquire
// timeout (a loaded machine) is waited for at start-up: Connect pings
// again instead of failing on the request-sized bound.
func TestConnectWaitsForASlowFirstConnection(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t, postgres.Schema{})
	const delay, acquire = time.Second, 200 * time.Millisecond
	slow := slowProxy(t, db.URL, delay)

	start := time.Now()
	pool, err := postgres.Connect(t.Context(), slow, postgres.WithTimeouts(postgres.Timeouts{Acquire: acquire}))
	require.NoError(t, err)
	pool.Close()
	took := time.Since(start)
	require.GreaterOrEqual(t, took, delay)
	require.Less(t, took, 10*delay, "a ping past the first connection answers at once")
}

// slowProxy returns dbURL through a proxy that holds each new connection
// for delay before it passes anything on.
func slowProxy(t *testing.T, dbURL string, delay time.Duration) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	upstream := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				time.Sleep(delay) // the fault: a server slow to answer
				server, err := net.Dial("tcp", upstream)
				if err != nil {
					client.Close()
					return
				}
				mu.Lock()
				conns = append(conns, client, server)
				mu.Unlock()
				wg.Go(func() { _, _ = io.Copy(server, client); server.Close() })
				_, _ = io.Copy(client, server)
				client.Close()
			})
		}
	})
	u.Host = ln.Addr().String()
	return u.String()
}

package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"
	tcnats "github.com/testcontainers/testcontainers-go/modules/nats"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// NATS is a NATS server with JetStream for one test.
type NATS struct {
	// URL connects to the server.
	URL string

	embedded bool
	storeDir string
	// authConf is the embedded server's natsauth configuration; creds are
	// the credentials it accepts, by identity (see Creds).
	authConf string
	creds    map[string]string

	mu      sync.Mutex
	srv     *server.Server // the embedded server, its latest instance
	running bool
	port    int
}

// NewNATS returns a NATS server with JetStream for the test: its own embedded
// server, or the binary's shared one, which the test then holds until it ends
// and whose streams are deleted then. Call it once per test, and not in both
// a test and its subtests: on a shared server the second call would wait for
// the first to be released.
func NewNATS(t testing.TB) *NATS {
	t.Helper()
	url, err := shared.sharedNATS()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if url != "" {
		shared.natsHeld.Lock()
		t.Cleanup(func() {
			defer shared.natsHeld.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := deleteStreams(ctx, url); err != nil {
				t.Errorf("testenv: %v", err)
			}
		})
		return &NATS{URL: url}
	}

	// A port from FreePorts rather than a random one, so that Restart finds
	// it still free.
	n := &NATS{embedded: true, storeDir: t.TempDir(), port: FreePorts(t, 1)[0]}
	if err := n.authorize(t.TempDir()); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := n.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	n.URL = n.srv.ClientURL()
	t.Cleanup(n.shutdown)
	return n
}

// authorize makes the embedded server trust a new natsauth.Authority and
// issues credentials for every identity of the saga's topology, and for
// the tests' own connections, into dir.
func (n *NATS) authorize(dir string) error {
	a, err := natsauth.New()
	if err != nil {
		return err
	}
	if n.authConf, err = a.ServerConfig(); err != nil {
		return err
	}
	n.creds, err = a.WriteCreds(dir, streams.Saga(streams.Config{}), natsauth.Admin)
	return err
}

// Client is how identity (a service of the saga's topology,
// streams.Provisioner or streams.Operator) connects to the server: with
// credentials of its own on an embedded server, which refuses anonymous
// connections, and without on a shared one.
func (n *NATS) Client(identity string) natsauth.Client {
	return natsauth.Client{URL: n.URL, Creds: n.creds[identity]}
}

// Conn connects to the server as the test, with every right in the
// account, and closes the connection when the test ends. The connection
// reconnects quickly and without limit, to ride out Restart; opts come after
// these defaults.
func (n *NATS) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return n.ConnAs(t, natsauth.Admin, opts...)
}

// ConnAs connects to the server as identity (see Client), as Conn does.
func (n *NATS) ConnAs(t testing.TB, identity string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append(append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
	}, n.Client(identity).Options(identity)...), opts...)
	nc, err := nats.Connect(n.URL, opts...)
	if err != nil {
		t.Fatalf("testenv: connect to nats %s: %v", n.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream client on a new connection (see Conn).
func (n *NATS) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(n.Conn(t))
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	return js
}

// Embedded reports whether the server is this test's own, embedded one,
// which Shutdown and Restart need.
func (n *NATS) Embedded() bool { return n.embedded }

// Shutdown stops the embedded server, as a broker outage would, until
// Restart. It fails the test if the server is shared.
func (n *NATS) Shutdown(t testing.TB) {
	t.Helper()
	if !n.embedded {
		t.Fatal("testenv: Shutdown needs an embedded NATS server; this one is shared")
	}
	n.shutdown()
}

// Restart stops the embedded server if it runs and starts a new one on the
// same port and JetStream store, which recovers the streams, their messages
// and consumers. It fails the test if the server is shared.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	if !n.embedded {
		t.Fatal("testenv: Restart needs an embedded NATS server; this one is shared")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shutdownLocked()
	if err := n.startLocked(); err != nil {
		t.Fatalf("testenv: restart nats: %v", err)
	}
}

// start starts an embedded server on n.port.
func (n *NATS) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.startLocked()
}

func (n *NATS) startLocked() error {
	opts := &server.Options{}
	if err := opts.ProcessConfigString(n.authConf); err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	opts.Host, opts.Port = "127.0.0.1", n.port
	opts.JetStream, opts.StoreDir = true, n.storeDir
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("embedded nats on port %d not ready for connections", n.port)
	}
	n.srv, n.running = srv, true
	return nil
}

func (n *NATS) shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shutdownLocked()
}

func (n *NATS) shutdownLocked() {
	if !n.running {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.running = false
}

// sharedNATS returns the URL of the binary's shared server, starting a
// container on first use, or "" when each test gets an embedded server.
func (e *environment) sharedNATS() (string, error) {
	if !e.running.Load() {
		return "", errNoRun
	}
	e.natsOnce.Do(func() {
		e.natsURL, e.natsErr = e.startNATS(context.Background())
	})
	return e.natsURL, e.natsErr
}

func (e *environment) startNATS(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // an image pull included
	defer cancel()
	if url := readSettings().natsURL; url != "" {
		e.logger.Info("nats for tests", "source", "TEST_NATS_URL", "reason", "TEST_NATS_URL is set", "url", url)
		return url, nil
	}
	choice, err := e.useContainers()
	if err != nil {
		return "", err
	}
	if !choice.Use {
		e.logger.Info("nats for tests", "source", "embedded nats-server per test",
			"reason", "TEST_NATS_URL is unset, no containers: "+choice.Reason)
		return "", nil
	}
	// Without the module's default -DV: trace logging of every message.
	ctr, err := tcnats.Run(ctx, NATSImage(), testcontainers.WithCmd("-js"),
		OnLoopback("4222/tcp", "6222/tcp", "8222/tcp"))
	e.markDockerUsed()
	if err != nil {
		return "", errors.Join(fmt.Errorf("nats container: %w", err), testcontainers.TerminateContainer(ctr))
	}
	e.onTeardown(func(ctx context.Context) error {
		return testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
	})
	url, err := ctr.ConnectionString(ctx)
	if err != nil {
		return "", fmt.Errorf("nats container: %w", err)
	}
	e.logger.Info("nats for tests", "source", "testcontainers "+NATSImage(),
		"reason", "TEST_NATS_URL is unset and "+choice.Reason, "url", url)
	return url, nil
}

// deleteStreams deletes every stream on the server at url, their consumers
// with them, so that the next test starts from nothing.
func deleteStreams(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	lister := js.StreamNames(ctx)
	var names []string
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	for _, name := range names {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete stream %s: %w", name, err)
		}
	}
	return nil
}

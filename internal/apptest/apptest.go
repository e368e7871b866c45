// Package apptest runs one service in-process for a test, on the test's own
// PostgreSQL database and NATS server, and gives the test what it needs to
// drive it: its HTTP base URL, a way to publish events (also as duplicates
// that bypass the broker's dedup window) and to watch the events it emits.
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// RunFunc runs a service with the shared configuration; each service adapts
// its own Run to it.
type RunFunc func(ctx context.Context, cfg app.Config, logger *slog.Logger) error

// Service is a service running for one test.
type Service struct {
	BaseURL string
	DB      *testenv.Database
	NATS    *testenv.NATS
	JS      jetstream.JetStream
	// Issuer signs the tokens the service accepts: the test's own dev
	// issuer, which the service reaches over HTTP like any provider.
	Issuer    *auth.Issuer
	IssuerURL string
}

// Start provisions the saga's topology and runs the service name, with its
// own credentials, until the test ends, with the defaults of app.Config
// except a short outbox poll interval; configure adjusts them.
// It returns once /readyz answers.
func Start(t *testing.T, name string, run RunFunc, configure ...func(*app.Config)) *Service {
	t.Helper()
	return StartWithStreams(t, name, run, streams.Config{}, configure...)
}

// StartWithStreams is Start with the topology provisioned with sc (e.g. a
// MaxDeliver of its own), as `onceflow provision` would with the stream
// settings of its environment.
func StartWithStreams(t *testing.T, name string, run RunFunc, sc streams.Config, configure ...func(*app.Config)) *Service {
	t.Helper()
	db := testenv.NewServiceDatabase(t, name)
	nt := testenv.NewNATS(t)
	issuer, issuerURL := StartIssuer(t)

	// As `onceflow provision` would, before the service waits for its
	// durables.
	require.NoError(t, natsauth.Provision(t.Context(), nt.Client(streams.Provisioner), streams.Saga(sc)))

	cfg, err := env.ParseAsWithOptions[app.Config](env.Options{Environment: map[string]string{
		"DATABASE_URL":         db.URL,
		"NATS_URL":             nt.URL,
		"NATS_CREDS":           nt.Client(name).Creds,
		"OUTBOX_POLL_INTERVAL": "100ms",
		"SHUTDOWN_TIMEOUT":     "10s",
		"AUTH_JWKS_URL":        issuerURL + auth.JWKSPath,
		"AUTH_ISSUER":          issuerURL,
	}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.HTTPListener = ln
	for _, f := range configure {
		f(&cfg)
	}

	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, logger) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "service %s stopped with an error", name)
		case <-time.After(30 * time.Second):
			t.Errorf("service %s did not stop within 30s", name)
		}
	})

	s := &Service{BaseURL: "http://" + ln.Addr().String(), DB: db, NATS: nt, JS: nt.JetStream(t), Issuer: issuer, IssuerURL: issuerURL}
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("service %s exited at start-up: %v", name, err)
		default:
		}
		resp, err := http.Get(s.BaseURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "service %s not ready", name)
	return s
}

// StartIssuer serves a dev token issuer until the test ends and returns it
// with its URL, which is also its tokens' issuer (AUTH_ISSUER).
func StartIssuer(t testing.TB) (*auth.Issuer, string) {
	t.Helper()
	var handler http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	issuer, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: srv.URL})
	require.NoError(t, err)
	handler = issuer.Handler()
	return issuer, srv.URL
}

// As returns the headers of a request by customer: extra's, and a bearer
// token of the test's issuer, with the e-mail customer@example.com, as an
// identity provider's would carry.
func (s *Service) As(t testing.TB, customer string, extra ...http.Header) http.Header {
	t.Helper()
	return s.bearer(t, auth.TokenRequest{Subject: customer, Email: customer + "@example.com"}, extra)
}

// AsAdmin returns the headers of a request by an operator: extra's, and a
// bearer token with the admin role.
func (s *Service) AsAdmin(t testing.TB, extra ...http.Header) http.Header {
	t.Helper()
	return s.bearer(t, auth.TokenRequest{Subject: "operator", Admin: true}, extra)
}

func (s *Service) bearer(t testing.TB, r auth.TokenRequest, extra []http.Header) http.Header {
	t.Helper()
	tok, err := s.Issuer.Token(r)
	require.NoError(t, err)
	h := http.Header{"Authorization": {"Bearer " + tok}}
	for _, e := range extra {
		for k, v := range e {
			h[k] = v
		}
	}
	return h
}

// Publish publishes ev as its producer's relay would (Nats-Msg-Id = event id).
func (s *Service) Publish(t testing.TB, ev event.Envelope) {
	t.Helper()
	s.publish(t, ev, ev.ID.String())
}

// PublishAtOnce publishes evs as Publish does, without waiting for each
// ack, so that a batched consumer may take them in one batch.
func (s *Service) PublishAtOnce(t testing.TB, evs ...event.Envelope) {
	t.Helper()
	for _, ev := range evs {
		msg, err := ev.Msg()
		require.NoError(t, err)
		_, err = s.JS.PublishMsgAsync(msg)
		require.NoError(t, err)
	}
	select {
	case <-s.JS.PublishAsyncComplete():
	case <-t.Context().Done():
	}
}

// PublishDuplicate publishes ev again under a fresh Nats-Msg-Id, so the
// broker's duplicate window does not drop it and only the inbox can.
func (s *Service) PublishDuplicate(t testing.TB, ev event.Envelope) {
	t.Helper()
	s.publish(t, ev, uuid.NewString())
}

func (s *Service) publish(t testing.TB, ev event.Envelope, msgID string) {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	_, err = s.JS.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

// Watch starts collecting the events published on subjects matching filter
// in stream, from the stream's start.
func (s *Service) Watch(t testing.TB, stream, filter string) *Watcher {
	t.Helper()
	cons, err := s.JS.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	require.NoError(t, err)
	w := &Watcher{events: make(chan event.Envelope, 10_000)}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		ev, err := event.FromMsg(msg.Headers(), msg.Data())
		if err != nil {
			t.Errorf("watched an invalid event: %v", err)
			return
		}
		w.events <- ev
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return w
}

// Watcher collects events.
type Watcher struct {
	events chan event.Envelope
	seen   []event.Envelope
}

// Wait returns once n events have arrived, all of them (more may have).
func (w *Watcher) Wait(t testing.TB, n int) []event.Envelope {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for len(w.seen) < n {
		select {
		case ev := <-w.events:
			w.seen = append(w.seen, ev)
		case <-deadline:
			t.Fatalf("waited for %d events, got %d", n, len(w.seen))
		}
	}
	return w.seen
}

// Seen returns every event that has arrived so far.
func (w *Watcher) Seen() []event.Envelope {
	for {
		select {
		case ev := <-w.events:
			w.seen = append(w.seen, ev)
		default:
			return w.seen
		}
	}
}

// Do sends a JSON request (body nil for none) and decodes a JSON response
// into out (nil to skip); it returns the response.
func (s *Service) Do(t testing.TB, method, path string, header http.Header, body, out any) *http.Response {
	t.Helper()
	var r io.Reader
	if body != nil {
		if raw, ok := body.([]byte); ok {
			r = bytes.NewReader(raw)
		} else {
			b, err := json.Marshal(body)
			require.NoError(t, err)
			r = bytes.NewReader(b)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), method, s.BaseURL+path, r)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, out), "response %d: %s", resp.StatusCode, raw)
	}
	return resp
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

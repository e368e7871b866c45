package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/payment"
)

// A service connects to a NATS server that requires TLS, with
// NATS_URL=tls://… and the CA in NATS_TLS_CA, and consumes and publishes
// over it; a client without TLS is refused.
func TestServicesOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, cert, key := makeCertificates(t, dir)
	authority, err := natsauth.New()
	require.NoError(t, err)
	conf, err := authority.ServerConfig()
	require.NoError(t, err)
	creds, err := authority.WriteCreds(filepath.Join(dir, "creds"), streams.Saga(streams.Config{}), natsauth.Admin)
	require.NoError(t, err)

	opts := &server.Options{}
	require.NoError(t, opts.ProcessConfigString(conf))
	opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	opts.JetStream, opts.StoreDir = true, filepath.Join(dir, "js")
	opts.NoLog, opts.NoSigs = true, true
	opts.TLS, opts.TLSTimeout = true, 5
	opts.TLSConfig, err = server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key})
	require.NoError(t, err)
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second))
	url := fmt.Sprintf("tls://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port)
	client := func(identity string) natsauth.Client {
		return natsauth.Client{URL: url, Creds: creds[identity], TLSCA: ca}
	}

	noCA := natsauth.Client{URL: url, Creds: creds[natsauth.Admin]}
	_, err = nats.Connect(url, append(noCA.Options(natsauth.Admin), nats.MaxReconnects(0))...)
	require.Error(t, err, "without the CA, the client does not trust the server")
	require.NoError(t, natsauth.Provision(t.Context(), client(streams.Provisioner), streams.Saga(streams.Config{})))

	db := testenv.NewServiceDatabase(t, payment.Name)
	_, issuerURL := apptest.StartIssuer(t)
	cfg, err := env.ParseAsWithOptions[payment.Config](env.Options{Environment: map[string]string{
		"AUTH_JWKS_URL":        issuerURL + auth.JWKSPath,
		"AUTH_ISSUER":          issuerURL,
		"DATABASE_URL":         db.URL,
		"NATS_URL":             url,
		"NATS_CREDS":           creds[payment.Name],
		"NATS_TLS_CA":          ca,
		"OUTBOX_POLL_INTERVAL": "100ms",
		"SHUTDOWN_TIMEOUT":     "10s",
	}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.HTTPListener = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- payment.Run(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + ln.Addr().String() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)

	// An order placed over TLS is answered over TLS (rejected: the
	// customer has no wallet).
	nc, err := nats.Connect(url, client(natsauth.Admin).Options(natsauth.Admin)...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	order := event.Order{OrderID: uuid.New(), CustomerID: "nobody"}
	placed, err := event.New("order", event.OrderPlaced, order.OrderID.String(), event.OrderPlacedV1{
		Order: order, Lines: event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 100}}, TotalCents: 100,
	})
	require.NoError(t, err)
	msg, err := placed.Msg()
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	cons, err := js.OrderedConsumer(t.Context(), streams.Payments, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	got, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	require.NoError(t, err)
	require.Equal(t, order.OrderID.String(), got.Headers().Get(event.HeaderSubject))
	require.Equal(t, string(event.PaymentRejected), got.Headers().Get(event.HeaderType))
}

// makeCertificates writes a CA and a server certificate for 127.0.0.1
// signed by it into dir, and returns their paths and the server's key's.
func makeCertificates(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "onceflow test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, caCert, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)

	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

package natsauth

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/streams"
)

// Client is how a process connects to NATS, read from its environment.
type Client struct {
	// URL is nats://host:port, or tls://host:port to require TLS.
	URL string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	// Creds is the path of the process's credentials file; empty connects
	// without (to a server that asks for none).
	Creds string `env:"NATS_CREDS"`
	// TLSCA is a PEM file of the CAs that may sign the server's certificate;
	// empty means the system's.
	TLSCA string `env:"NATS_TLS_CA"`
}

// Options are the nats.go options that connect as identity with c's
// credentials and CA. Replies come back on identity's own inbox prefix,
// the only one its permissions let it read.
func (c Client) Options(identity string) []nats.Option {
	opts := []nats.Option{nats.CustomInboxPrefix(streams.InboxPrefix(identity))}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	return opts
}

// Provision connects to c's server as streams.Provisioner and provisions t:
// what `onceflow provision` and `onceflow dev` do before the services
// consume.
func Provision(ctx context.Context, c Client, t streams.Topology) error {
	nc, err := nats.Connect(c.URL, append(c.Options(streams.Provisioner), nats.Name("onceflow-provision"))...)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", c.URL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return streams.Provision(ctx, js, t)
}

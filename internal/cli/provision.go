package cli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/streams"
)

// provisionEnv is what `onceflow provision` reads from the environment.
type provisionEnv struct {
	NATS    natsauth.Client
	Streams streams.Config
}

func runProvision(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("provision", commandUsage("provision"), `
Creates or updates the saga's streams, the DLQ and every durable consumer
of the topology (internal/streams), as the provisioner: the one identity
with the right to, given in NATS_CREDS. The services only wait for their
durables. Running it again changes nothing; it retries until --wait has
passed while NATS is unreachable or its JetStream not ready.

Stream settings: STREAM_REPLICAS, STREAM_MAX_AGE, STREAM_DUPLICATE_WINDOW,
STREAM_MAX_BYTES, STREAM_MAX_MSG_SIZE, DLQ_MAX_AGE, DLQ_MAX_PER_CONSUMER
(each durable's budget of DLQ entries), DLQ_MAX_MSG_SIZE (an entry's),
DLQ_MAX_BYTES (the DLQ_ACTIONS stream's).`)
	wait := fs.Duration("wait", time.Minute, "retry for at most this long")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	cfg, err := env.ParseAs[provisionEnv]()
	if err != nil {
		return fmt.Errorf("provision config: %w", err)
	}
	topology := streams.Saga(cfg.Streams)
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	for {
		err = natsauth.Provision(ctx, cfg.NATS, topology)
		if err == nil {
			break
		}
		inv.logger.WarnContext(ctx, "provisioning failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("provision: %w", err)
		case <-time.After(time.Second):
		}
	}
	fmt.Fprintf(inv.stdout, "provisioned %d streams and %d durable consumers on %s\n",
		len(topology.AllStreams()), len(topology.Consumers), cfg.NATS.URL)
	return nil
}

func runNATSAuth(_ context.Context, inv invocation, args []string) error {
	fs := flagSet("nats-auth", commandUsage("nats-auth"), `
Makes a NATS server trust onceflow's identities, in --dir: the keys of the
operator, the accounts and the account's signing key (created once, kept),
the server's configuration server.conf (include it in nats-server's), and
new credentials in creds/<identity>.creds for each service, the provisioner
and the operator, with the permissions the topology gives them. Each process
gets its own file as NATS_CREDS.

--rotate replaces the signing key first: every credential issued before is
refused once the server has reloaded server.conf.`)
	dir := fs.String("dir", "", "`directory` of the keys, server.conf and creds/ (required)")
	rotate := fs.Bool("rotate", false, "replace the signing key, invalidating the credentials issued before")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 || *dir == "" {
		return usageError(fs, "takes --dir and no arguments")
	}
	open := natsauth.Open
	if *rotate {
		open = natsauth.Rotate
	}
	authority, err := open(*dir)
	if err != nil {
		return err
	}
	conf, err := authority.ServerConfig()
	if err != nil {
		return err
	}
	// Public keys and JWTs only: no secret.
	if err := os.WriteFile(filepath.Join(*dir, "server.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("write server.conf: %w", err)
	}
	creds, err := authority.WriteCreds(filepath.Join(*dir, "creds"), streams.Saga(streams.Config{}), registry.Names()...)
	if err != nil {
		return err
	}
	ids := slices.Sorted(maps.Keys(creds))
	fmt.Fprintf(inv.stdout, "%s written; credentials for %v in %s\n",
		filepath.Join(*dir, "server.conf"), ids, filepath.Join(*dir, "creds"))
	return nil
}

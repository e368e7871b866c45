package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/inventory"
	"github.com/onceflow/onceflow/services/notify"
	"github.com/onceflow/onceflow/services/order"
	"github.com/onceflow/onceflow/services/payment"
)

// devEnv is what `onceflow dev` reads from the environment itself; the
// services read the rest (everything but DATABASE_URL, NATS_URL and
// HTTP_ADDR, which dev sets).
type devEnv struct {
	// DatabaseURL names a PostgreSQL server to use instead of a local
	// cluster.
	DatabaseURL string `env:"DATABASE_URL"`
	// OperatorSecret is what the dev issuer wants to issue an admin
	// token; default a fresh one, printed.
	OperatorSecret string `env:"ISSUER_OPERATOR_SECRET"`
	// IssuerHosts are host names the dev issuer's POST /token answers
	// besides its own address's (for --host other than loopback).
	IssuerHosts []string `env:"ISSUER_HOSTS"`
	// PostgresImage is PostgreSQL's image when no installation is found
	// and a Docker engine answers.
	PostgresImage string `env:"POSTGRES_IMAGE"`
}

// devStopTimeout bounds the shutdown after Ctrl-C; a second Ctrl-C kills.
const devStopTimeout = time.Minute

// runDev is `onceflow dev`: the whole system in one process until ctx ends.
func runDev(ctx context.Context, inv invocation, args []string) error {
	cfg, flags, err := parseDev(inv, args)
	if err != nil {
		return helped(err) // -h printed the usage: done
	}
	if flags.pprofAddr != "" {
		stop, err := servePprof(flags.pprofAddr, inv.logger)
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		defer stop()
	}
	if !loopback(cfg.Host) {
		inv.logger.WarnContext(ctx, "onceflow dev is for development: listening on "+cfg.Host+", its token issuer gives any customer's token to whoever reaches it, and an admin token to whoever has the printed operator secret (ISSUER_HOSTS names the host names it answers besides its address)",
			"host", cfg.Host)
	}
	e, err := dev.Start(ctx, cfg, inv.logger)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	printEnv(inv.stdout, e, cfg)
	stopConsole := func() error { return nil }
	if flags.consolePort >= 0 {
		url, token, stop, err := serveDevConsole(ctx, inv, e, cfg.Host, flags.consolePort)
		if err != nil {
			return errors.Join(fmt.Errorf("dev: %w", err), stopDev(ctx, e))
		}
		stopConsole = stop
		fmt.Fprintf(inv.stdout, "  console    %s  (sign in with $ADMIN or the operator token %s)\n", url, token)
	}
	if flags.seed {
		seeded, err := dev.Seed(ctx, e)
		if err != nil {
			return errors.Join(fmt.Errorf("dev: %w", err), stopDev(ctx, e))
		}
		printSeeded(inv.stdout, e, seeded)
	}
	fmt.Fprintln(inv.stdout, "Press Ctrl-C to stop.")

	<-e.Done() // ctx ended (a signal) or a service failed
	inv.logger.InfoContext(ctx, "services stopped; stopping NATS and PostgreSQL")
	if err := errors.Join(stopConsole(), stopDev(ctx, e)); err != nil {
		return err
	}
	if cfg.DatabaseURL == "" && cfg.DataDir == "" {
		fmt.Fprintln(inv.stdout, "Stopped; its temporary data is removed.")
	} else {
		fmt.Fprintln(inv.stdout, "Stopped; its data is kept.")
	}
	return nil
}

// devFlags are the flags of onceflow dev that are not the environment's
// configuration.
type devFlags struct {
	seed        bool
	pprofAddr   string
	consolePort int
}

// parseDev parses onceflow dev's flags and environment; after printing
// the usage for -h it returns errHelp.
func parseDev(inv invocation, args []string) (dev.Config, devFlags, error) {
	defaults := dev.DefaultPorts()
	fs := flagSet("dev", commandUsage("dev"), `
Runs every service in one process, on an embedded NATS server with
JetStream and a throwaway local PostgreSQL cluster with one database per
service, and prints where everything is. Ctrl-C (SIGINT) or SIGTERM stops
it cleanly and removes what it created.

With DATABASE_URL set, its server is used instead of a local cluster: the
databases onceflow_order, onceflow_payment, onceflow_inventory and
onceflow_notify are created on it if missing, and kept. Without it and
without a PostgreSQL installation (initdb, postgres), PostgreSQL runs in a
Docker container of POSTGRES_IMAGE (default `+dev.DefaultPostgresImage+`;
make demo-images builds a stand-in where no registry answers), removed on
exit. The services read
every other setting (CONSUMER_BATCH_SIZE, SMTP_ADDR, …) from the environment
as 'onceflow <service>' does.`)
	seed := fs.Bool("seed", false, "credit wallets alice and bob and stock apple, pear and plum once the services are ready")
	dataDir := fs.String("data-dir", "", "keep PostgreSQL and JetStream data in `DIR` across runs (default: temporary, removed on exit)")
	durable := fs.Bool("durable", false, "fsync every write (PostgreSQL's defaults, JetStream sync always); off, a machine crash loses recent writes")
	natsSync := fs.String("nats-sync", "", "when JetStream fsyncs: `always` (sync_interval: always) or interval (the server's default, two minutes); default always with --durable, else interval")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	httpPort := fs.Int("http-port", defaults.Order, "`port` of the order API; payment, inventory, notify, the token issuer and any added service take the next ones (0: free ports)")
	natsPort := fs.Int("nats-port", defaults.NATS, "`port` of the NATS server (0: a free port)")
	pgPort := fs.Int("pg-port", defaults.Postgres, "`port` of the local PostgreSQL cluster (0: a free port)")
	consolePort := fs.Int("console-port", defaultConsolePort, "`port` of the operator's console (0: a free port, -1: none)")
	clusterNodes := fs.Int("cluster", 0, "run NATS as a cluster of `N` nodes (3), each a process of its own, with R3 streams: kill one by hand and the saga goes on; it is started again 5s later")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on `ADDR` (e.g. 127.0.0.1:6060), to profile the services under load")
	if err := parse(fs, args, inv.stdout); err != nil {
		return dev.Config{}, devFlags{}, err
	}
	if fs.NArg() > 0 {
		return dev.Config{}, devFlags{}, usageError(fs, "takes no arguments")
	}
	var syncMode dev.NATSSync
	switch *natsSync {
	case "":
	case "always":
		syncMode = dev.NATSSyncAlways
	case "interval":
		syncMode = dev.NATSSyncInterval
	default:
		return dev.Config{}, devFlags{}, usageError(fs, "--nats-sync wants always or interval")
	}
	denv, err := env.ParseAs[devEnv]()
	if err != nil {
		return dev.Config{}, devFlags{}, fmt.Errorf("dev config: %w", err)
	}

	cfg := dev.Config{
		Host: *host,
		Ports: dev.Ports{
			NATS:     *natsPort,
			Postgres: *pgPort,
		},
		DatabaseURL:    denv.DatabaseURL,
		OperatorSecret: denv.OperatorSecret,
		IssuerHosts:    denv.IssuerHosts,
		PostgresImage:  denv.PostgresImage,
		DataDir:        *dataDir,
		Durable:        *durable,
		NATSSync:       syncMode,
		Environ:        os.Environ(),
	}
	if cfg.ClusterNodes, cfg.NATSNodeCommand, err = natsCluster(fs, *clusterNodes); err != nil {
		return dev.Config{}, devFlags{}, err
	}
	if *httpPort != 0 {
		cfg.Ports.Order, cfg.Ports.Payment, cfg.Ports.Inventory, cfg.Ports.Notify, cfg.Ports.Issuer = *httpPort, *httpPort+1, *httpPort+2, *httpPort+3, *httpPort+4
	}
	return cfg, devFlags{seed: *seed, pprofAddr: *pprofAddr, consolePort: *consolePort}, nil
}

// natsCluster is dev's cluster of n nodes (--cluster), each run by this
// binary's nats-server command; none for n below 2.
func natsCluster(fs *flag.FlagSet, n int) (int, []string, error) {
	if n == 2 || n < 0 {
		return 0, nil, usageError(fs, "--cluster wants 3 or more nodes: two cannot lose one and keep a majority")
	}
	if n < 2 {
		return 0, nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return 0, nil, fmt.Errorf("dev: the nodes run this binary: %w", err)
	}
	return n, []string{self, "nats-server"}, nil
}

// servePprof serves the runtime profiles on addr until stop is called. The
// handlers are on a mux of their own, never on a service's API.
func servePprof(addr string, logger *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("pprof server", "err", err)
		}
	}()
	logger.Info("pprof serving", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { _ = srv.Close() }, nil
}

// stopDev stops e, bounded by devStopTimeout even when ctx has ended.
func stopDev(ctx context.Context, e *dev.Env) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), devStopTimeout)
	defer cancel()
	if err := e.Stop(ctx); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	return nil
}

// printEnv says where everything is.
func printEnv(w io.Writer, e *dev.Env, cfg dev.Config) {
	fmt.Fprintln(w, "\nonceflow dev is running:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range e.Services {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Name, s.URL, s.DatabaseURL)
	}
	fmt.Fprintf(tw, "  issuer\t%s\t(dev tokens: POST /token, keys: %s)\n", e.IssuerURL, auth.JWKSPath)
	if len(e.NATSNodes) == 0 {
		fmt.Fprintf(tw, "  nats\t%s\n", e.NATSURL)
	}
	for _, n := range e.NATSNodes {
		fmt.Fprintf(tw, "  nats %s\t%s\tkill -9 \"$(cat %s)\"\n", n.Name, n.URL, n.PIDFile)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "  NATS credentials: %s (this run's, one per identity; onceflow audit, dlq and consumer: NATS_CREDS=%s)\n",
		filepath.Dir(e.NATSCreds[streams.Operator]), e.NATSCreds[streams.Operator])
	switch {
	case cfg.DatabaseURL != "":
		fmt.Fprintln(w, "  PostgreSQL is DATABASE_URL's server; its databases are kept.")
	case cfg.DataDir != "":
		fmt.Fprintf(w, "  PostgreSQL and JetStream data are kept in %s.\n", cfg.DataDir)
	default:
		fmt.Fprintln(w, "  PostgreSQL and JetStream data are temporary: removed on exit.")
	}
	fmt.Fprintln(w, "  Each API serves /healthz, /readyz, /metrics and /openapi.yaml; the rest needs a token.")
	printTokens(w, e)
}

// printTokens prints ready-to-paste tokens of the dev issuer: two
// customers and an operator.
func printTokens(w io.Writer, e *dev.Env) {
	fmt.Fprintf(w, "\nTokens of the dev issuer, valid %s (more: curl -s -X POST %s/token -d sub=carol -d email=carol@example.com;\n"+
		"an operator's needs the run's secret: curl -s -X POST %s/token -H \"Authorization: Bearer $OPERATOR_SECRET\" -d sub=ops -d role=admin):\n\n",
		e.Issuer.TTL(), e.IssuerURL, e.IssuerURL)
	// The customers' tokens carry an e-mail, the address their orders
	// default to, as an identity provider's would.
	for _, t := range []struct {
		name string
		auth.TokenRequest
	}{
		{"ALICE", auth.TokenRequest{Subject: "alice", Email: "alice@example.com"}},
		{"BOB", auth.TokenRequest{Subject: "bob", Email: "bob@example.com"}},
		{"ADMIN", auth.TokenRequest{Subject: "admin", Admin: true}},
	} {
		tok, err := e.Issuer.Token(t.TokenRequest)
		if err != nil {
			tok = fmt.Sprintf("'' # no token: %v", err) // a signing key that cannot sign
		}
		fmt.Fprintf(w, "  export %s=%s\n", t.name, tok)
	}
	fmt.Fprintf(w, "  export OPERATOR_SECRET=%s\n", e.Issuer.OperatorSecret())
}

// loopback reports whether host is a loopback address or name (or empty:
// dev's default, 127.0.0.1).
func loopback(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost" || host == ""
}

// printSeeded says what Seed wrote and how to place an order.
func printSeeded(w io.Writer, e *dev.Env, seeded dev.Seeded) {
	var wallets, stock, prices []string
	for _, wl := range seeded.Wallets {
		wallets = append(wallets, fmt.Sprintf("%s %d cents", wl.CustomerID, wl.BalanceCents))
	}
	for _, s := range seeded.Stock {
		stock = append(stock, fmt.Sprintf("%s %d", s.SKU, s.Available))
	}
	for _, p := range seeded.Products {
		prices = append(prices, fmt.Sprintf("%s %d cents", p.SKU, p.UnitPriceCents))
	}
	fmt.Fprintf(w, `
Seeded wallets: %s.
Seeded stock:   %s.
Seeded prices:  %s (the catalog: GET %s/products).

Place an order (the same Idempotency-Key again replays it instead of placing another):

  curl -s -X POST %s/orders -H "Authorization: Bearer $ALICE" \
    -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-1' \
    -d '{"customer_email":"alice@example.com","items":[{"sku":"apple","quantity":3}]}'

Watch it finish, then look at the effects:

  curl -s -H "Authorization: Bearer $ALICE" %s/orders/ORDER_ID
  curl -s -H "Authorization: Bearer $ALICE" %s/wallets/alice
  curl -s -H "Authorization: Bearer $ALICE" %s/stock/apple
  curl -s -H "Authorization: Bearer $ALICE" '%s/notifications?order_id=ORDER_ID'

`, strings.Join(wallets, ", "), strings.Join(stock, ", "), strings.Join(prices, ", "), e.URL(order.Name),
		e.URL(order.Name), e.URL(order.Name), e.URL(payment.Name), e.URL(inventory.Name), e.URL(notify.Name))
}

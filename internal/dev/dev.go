package dev

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/freeport"
	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/streams"
)

const (
	defaultHost           = "127.0.0.1"
	defaultDatabasePrefix = "onceflow_"
	defaultReadyTimeout   = 2 * time.Minute
	// teardownTimeout bounds the clean-up of a Start that failed.
	teardownTimeout = time.Minute
)

// Ports are the TCP ports Start listens on. Zero means a free port chosen by
// the system. Services added after the saga's four (see internal/registry)
// listen on the ports after the issuer's, which is Notify's plus one.
type Ports struct {
	Order, Payment, Inventory, Notify int
	// Issuer is the dev token issuer's.
	Issuer int
	NATS   int
	// Postgres is the local cluster's port; unused with Config.DatabaseURL.
	Postgres int
}

// http is the API port of the i-th service: the saga's four have theirs, and
// the services added later take the ports after the issuer's, Notify's plus
// one (free ports when Notify is 0).
func (p Ports) http(i int) int {
	saga := []int{p.Order, p.Payment, p.Inventory, p.Notify}
	switch {
	case i < len(saga):
		return saga[i]
	case p.Notify == 0:
		return 0
	}
	return p.Notify + 2 + i - len(saga)
}

// DefaultPorts are the ports of `onceflow dev`: the APIs on 8080 (order),
// 8081 (payment), 8082 (inventory) and 8083 (notify), the token issuer on
// 8084, NATS on 4222, and PostgreSQL on a free port, since 5432 is often
// taken by a local server.
func DefaultPorts() Ports {
	return Ports{Order: 8080, Payment: 8081, Inventory: 8082, Notify: 8083, Issuer: 8084, NATS: 4222}
}

// Config configures Start. The zero value runs everything on 127.0.0.1 on
// free ports, on a throwaway local PostgreSQL cluster, with every service
// setting at its default: what a test wants.
type Config struct {
	// Host is the address everything listens on; default 127.0.0.1.
	Host  string
	Ports Ports
	// DatabaseURL, when set, names an existing PostgreSQL server on which the
	// four databases are created if missing (and kept), instead of a local
	// cluster. It must be allowed to create databases unless they exist.
	DatabaseURL string
	// DatabasePrefix prefixes the service names to name the databases;
	// default "onceflow_" (onceflow_order, …).
	DatabasePrefix string
	// PostgresImage is the image of PostgreSQL in a container, which Start
	// runs when no PostgreSQL installation is found (nor DatabaseURL set)
	// and a Docker engine answers; default DefaultPostgresImage.
	PostgresImage string
	// PostgresBinDir holds initdb and postgres; empty means found on PATH
	// or in the usual places (see localpg).
	PostgresBinDir string
	// DataDir, when set, keeps the local cluster (DataDir/postgres) and the
	// JetStream store (DataDir/nats) across runs. Empty means temporary
	// directories, removed by Stop.
	DataDir string
	// Durable keeps PostgreSQL's crash-safety settings and makes JetStream
	// fsync every write. Off, a crash of the machine (not of the process)
	// loses recent writes: fine for a demo.
	Durable bool
	// NATSSync says when the embedded JetStream fsyncs; the zero value
	// follows Durable. It lets a benchmark vary the broker's durability
	// alone.
	NATSSync NATSSync
	// TracerProvider, when set, traces every service (instead of the
	// provider the OTEL_* variables describe); the services do not shut it
	// down. Tests set it to record spans.
	TracerProvider trace.TracerProvider
	// Environ is the environment the services read their configuration from,
	// as os.Environ returns it (the stream settings of streams.Config too,
	// for the provisioning). Start overrides DATABASE_URL, NATS_URL,
	// NATS_CREDS, HTTP_ADDR and AUTH_* (its own issuer's) in it, and sets OUTBOX_ATOMIC_BATCH_MIN to 0 where it is
	// unset and JetStream does not fsync every write. Nil means every other
	// setting at its default.
	Environ []string
	// OperatorSecret is what the dev issuer's POST /token wants, as a
	// bearer token, to issue an admin token; default a fresh one
	// (Env.Issuer.OperatorSecret), logged.
	OperatorSecret string
	// IssuerHosts are host names the dev issuer's POST /token answers
	// besides its address's (and the loopback names with its port).
	IssuerHosts []string
	// TestAdmin issues natsauth.Admin's credentials too
	// (Env.NATSCreds[natsauth.Admin]): every right in the account, for
	// tests that corrupt the system on purpose. onceflow dev never sets it.
	TestAdmin bool
	// ReadyTimeout bounds the wait for every service to answer /readyz;
	// default 2 minutes.
	ReadyTimeout time.Duration
	// ClusterNodes, when above 1, runs NATS as that many nodes of one
	// cluster, each a child process (NATSNodeCommand) on the ports from
	// Ports.NATS on, with R3 streams (STREAM_REPLICAS=3 unless Environ sets
	// it); a node that dies is started again a few seconds later. Zero or 1
	// is one embedded server.
	ClusterNodes int
	// NATSNodeCommand is the command line of a cluster node, to which
	// "-c CONFIG" is appended: a nats-server binary, or onceflow's own
	// nats-server command.
	NATSNodeCommand []string
}

// NATSSync is when the embedded JetStream server fsyncs its writes.
type NATSSync int

const (
	// NATSSyncAuto fsyncs on every write with Config.Durable, else on the
	// server's interval.
	NATSSyncAuto NATSSync = iota
	// NATSSyncInterval fsyncs on the server's default interval (two
	// minutes): an acknowledged write can be lost in a machine crash.
	NATSSyncInterval
	// NATSSyncAlways fsyncs every write before acknowledging it
	// (sync_interval: always).
	NATSSyncAlways
)

// Service is where one running service is reachable.
type Service struct {
	Name string
	// URL is the base URL of its HTTP API, e.g. http://127.0.0.1:8080.
	URL string
	// DatabaseURL connects to its database.
	DatabaseURL string
}

// Env is the running system started by Start.
type Env struct {
	// Services are order, payment, inventory and notify, in that order.
	Services []Service
	// NATSURL connects to the embedded NATS server, which refuses anonymous
	// connections, or lists the cluster's nodes.
	NATSURL string
	// NATSNodes are the cluster's nodes, with Config.ClusterNodes.
	NATSNodes []*NATSNode
	// NATSCreds are the credentials files the server accepts, issued for
	// this run, by identity: each service's, streams.Provisioner's and
	// streams.Operator's (for onceflow audit).
	NATSCreds map[string]string
	// Issuer signs the tokens the services accept; IssuerURL serves its
	// token endpoint and JWKS (see package auth).
	Issuer    *auth.Issuer
	IssuerURL string

	logger    *slog.Logger
	listeners []net.Listener
	issuerLn  net.Listener
	nats      *server.Server
	tempDirs  []string
	cluster   *localpg.Cluster
	ports     freeport.Pool      // reserves the NATS cluster's free ports
	container *postgresContainer // PostgreSQL in Docker, for want of an installation

	cancel context.CancelFunc // ends the services
	done   chan struct{}      // closed when every service has returned
	runErr error              // of the services; read after done is closed

	stopOnce sync.Once
	stopErr  error
}

// Start starts PostgreSQL (or uses Config.DatabaseURL's server), NATS and the
// four services, and returns once every service answers /readyz. The
// services run until ctx ends, one of them fails, or Stop is called; the
// caller must call Stop in every case, to stop NATS and PostgreSQL and remove
// what Start created. On error, Start has already undone everything.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Env, err error) {
	cfg.Host = cmp.Or(cfg.Host, defaultHost)
	cfg.DatabasePrefix = cmp.Or(cfg.DatabasePrefix, defaultDatabasePrefix)
	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, defaultReadyTimeout)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir != "" {
		// The cluster's processes run in other working directories.
		if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
			return nil, fmt.Errorf("data directory: %w", err)
		}
	}
	e := &Env{logger: logger, done: make(chan struct{})}
	defer func() {
		if err != nil {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
			defer cancel()
			err = errors.Join(err, e.Stop(ctx))
		}
	}()

	services := all()
	// The HTTP listeners first: a port in use is the likeliest failure, and
	// is reported before anything slow has started.
	if err := e.listen(ctx, cfg, services); err != nil {
		return nil, err
	}

	if err := e.startBroker(ctx, cfg); err != nil {
		return nil, err
	}
	serverURL, err := e.startPostgres(ctx, cfg)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(services))
	for i, svc := range services {
		names[i] = cfg.DatabasePrefix + svc.name
		e.Services[i].DatabaseURL = serverURL(names[i])
	}
	if err := createDatabases(ctx, serverURL(""), names); err != nil {
		return nil, err
	}

	environ := overlay(servicesEnviron(cfg), map[string]string{
		"AUTH_JWKS_URL": e.IssuerURL + auth.JWKSPath,
		"AUTH_ISSUER":   e.IssuerURL,
		"AUTH_AUDIENCE": auth.DefaultAudience,
	})
	if err := provision(ctx, natsauth.Client{URL: e.NATSURL, Creds: e.NATSCreds[streams.Provisioner]}, environ); err != nil {
		return nil, err
	}
	e.runServices(ctx, services, environ, cfg.TracerProvider, logger)

	if err := e.waitReady(ctx, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	return e, nil
}

// runServices runs the issuer and every service on its listener, with
// environ and its own database and NATS credentials, until ctx ends or one
// fails; e.done is closed once they have all returned. The issuer stops
// last: a service fetches its key set until it stops, and a fetch cut off
// mid-way would only hold the issuer's shutdown.
func (e *Env) runServices(ctx context.Context, services []service, environ map[string]string, tp trace.TracerProvider, logger *slog.Logger) {
	runCtx, cancel := context.WithCancel(ctx)
	e.cancel = cancel
	issuerCtx, stopIssuer := context.WithCancel(context.WithoutCancel(ctx))
	issuerDone := make(chan error, 1)
	go func() {
		err := e.Issuer.Serve(issuerCtx, e.issuerLn, logger.With("component", "issuer"))
		if err != nil {
			cancel() // the services cannot verify a token without it
		}
		issuerDone <- err
	}()
	g, gctx := errgroup.WithContext(runCtx)
	for i, svc := range services {
		env := overlay(environ, map[string]string{
			"DATABASE_URL": e.Services[i].DatabaseURL,
			"NATS_URL":     e.NATSURL,
			"NATS_CREDS":   e.NATSCreds[svc.name],
			"HTTP_ADDR":    e.listeners[i].Addr().String(),
		})
		ln := e.listeners[i]
		g.Go(func() error {
			if err := svc.run(gctx, env, ln, logger, func(c *app.Config) { c.TracerProvider = tp }); err != nil {
				return fmt.Errorf("%s: %w", svc.name, err)
			}
			return nil
		})
	}
	go func() {
		err := g.Wait()
		stopIssuer()
		e.runErr = errors.Join(err, <-issuerDone)
		close(e.done)
	}()
}

// URL is the base URL of the named service's HTTP API, or "" if there is no
// such service.
func (e *Env) URL(service string) string {
	for _, s := range e.Services {
		if s.Name == service {
			return s.URL
		}
	}
	return ""
}

// Done is closed when every service has returned: the context given to
// Start ended, a service failed, or Stop was called.
func (e *Env) Done() <-chan struct{} { return e.done }

// Wait waits until every service has returned and returns the first error
// among them.
func (e *Env) Wait() error {
	<-e.done
	return e.runErr
}

// Stop stops the services and waits for them to finish (each flushes its
// outbox while NATS and PostgreSQL are still up), then shuts NATS and the
// local cluster down and removes the directories Start created. It returns
// the services' error, if any, with those of the teardown. ctx bounds the
// cluster's shutdown; the services are bounded by their SHUTDOWN_TIMEOUT.
// Calling Stop again returns the same result.
func (e *Env) Stop(ctx context.Context) error {
	e.stopOnce.Do(func() { e.stopErr = e.stop(ctx) })
	return e.stopErr
}

func (e *Env) stop(ctx context.Context) error {
	var errs []error
	if e.cancel != nil {
		e.cancel()
		errs = append(errs, e.Wait())
	} else {
		close(e.done) // the services never started
	}
	// A service that failed before serving has not closed its listener.
	for _, ln := range append(e.listeners, e.issuerLn) {
		if ln != nil {
			_ = ln.Close()
		}
	}
	if e.nats != nil {
		e.nats.Shutdown()
		e.nats.WaitForShutdown()
	}
	for _, n := range e.NATSNodes {
		n.stop()
	}
	errs = append(errs, e.ports.Close())
	if e.cluster != nil {
		errs = append(errs, e.cluster.Stop(ctx))
	}
	if e.container != nil {
		errs = append(errs, e.container.stop(ctx))
	}
	for _, dir := range e.tempDirs {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// startBroker starts the embedded NATS server, or the cluster's nodes.
func (e *Env) startBroker(ctx context.Context, cfg Config) error {
	conf, err := e.authorize(cfg)
	if err != nil {
		return err
	}
	if cfg.ClusterNodes > 1 {
		return e.startCluster(ctx, cfg, conf)
	}
	return e.startNATS(cfg, conf)
}

// listen listens on the services' HTTP ports, then makes the issuer.
func (e *Env) listen(ctx context.Context, cfg Config, services []service) error {
	for i, svc := range services {
		addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Ports.http(i)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s API on %s: %w", svc.name, addr, err)
		}
		e.listeners = append(e.listeners, ln)
		e.Services = append(e.Services, Service{Name: svc.name, URL: "http://" + ln.Addr().String()})
	}
	return e.newIssuer(ctx, cfg)
}

// newIssuer listens on the issuer's port and makes the dev issuer, whose
// tokens name its URL as their issuer; Start serves it beside the services.
func (e *Env) newIssuer(ctx context.Context, cfg Config) error {
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Ports.Issuer))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("token issuer on %s: %w", addr, err)
	}
	e.issuerLn = ln
	e.IssuerURL = "http://" + ln.Addr().String()
	e.Issuer, err = auth.NewIssuer(ctx, auth.IssuerConfig{
		Issuer: e.IssuerURL, Audience: auth.DefaultAudience, OperatorSecret: cfg.OperatorSecret, Hosts: cfg.IssuerHosts,
	})
	if err != nil {
		return err
	}
	e.logger.InfoContext(ctx, "dev token issuer: an admin token needs the operator secret as a bearer token", "url", e.IssuerURL, "operator_secret", e.Issuer.OperatorSecret())
	return nil
}

// AuthConfig is how the services verify the dev issuer's tokens.
func (e *Env) AuthConfig() auth.Config {
	return auth.Config{JWKSURL: e.IssuerURL + auth.JWKSPath, Issuer: e.IssuerURL, Audience: auth.DefaultAudience}
}

// Token is a token of the dev issuer for customer, an operator's with
// admin. A customer's carries the e-mail customer@example.com, the
// address their orders are sent to, as an identity provider's would.
func (e *Env) Token(customer string, admin bool) (string, error) {
	r := auth.TokenRequest{Subject: customer, Admin: admin}
	if !admin {
		r.Email = customer + "@example.com"
	}
	return e.Issuer.Token(r)
}

// startNATS starts the embedded NATS server with JetStream.
func (e *Env) startNATS(cfg Config, authConf string) error {
	storeDir, err := e.dir(cfg.DataDir, "nats")
	if err != nil {
		return err
	}
	port := cfg.Ports.NATS
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	if port == 0 {
		port = server.RANDOM_PORT // 0 would mean 4222 to nats-server
	} else {
		// nats-server reports a port in use only to its log, after Start;
		// try the port first so that the error says what is wrong.
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("nats on %s (is another NATS server or onceflow dev running?): %w", addr, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(authConf); err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	opts.ServerName = "onceflow-dev"
	opts.Host, opts.Port = cfg.Host, port
	opts.JetStream, opts.StoreDir, opts.SyncAlways = true, storeDir, cfg.natsSyncAlways()
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	srv.SetLoggerV2(natsLogger{e.logger.With("component", "nats")}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("embedded nats on %s not ready for connections (see its log above)", addr)
	}
	e.nats = srv
	e.NATSURL = srv.ClientURL()
	return nil
}

// authorize returns the NATS server's natsauth configuration, and issues
// this run's credentials. The authority's keys
// are kept in DataDir beside the JetStream store, whose streams belong to
// its account; the credentials are new every run.
func (e *Env) authorize(cfg Config) (string, error) {
	authority, err := natsauth.New()
	if cfg.DataDir != "" {
		authority, err = natsauth.Open(filepath.Join(cfg.DataDir, "nats-auth"))
	}
	if err != nil {
		return "", fmt.Errorf("nats authority: %w", err)
	}
	conf, err := authority.ServerConfig()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "onceflow-creds-")
	if err != nil {
		return "", fmt.Errorf("create credentials directory: %w", err)
	}
	e.tempDirs = append(e.tempDirs, dir)
	more := registry.Names()
	if cfg.TestAdmin {
		more = append(more, natsauth.Admin)
	}
	if e.NATSCreds, err = authority.WriteCreds(dir, streams.Saga(streams.Config{}), more...); err != nil {
		return "", err
	}
	return conf, nil
}

// startPostgres starts the local cluster, unless cfg names a server, and
// returns how to name a database on the server.
func (e *Env) startPostgres(ctx context.Context, cfg Config) (func(database string) string, error) {
	if cfg.DatabaseURL != "" {
		return serverURLs(cfg.DatabaseURL)
	}
	var dir string
	if cfg.DataDir != "" {
		dir = filepath.Join(cfg.DataDir, "postgres")
		// Traversable: as root, the server runs as the postgres user.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	cluster, err := localpg.Start(ctx, localpg.Config{
		Dir:     dir,
		Port:    cfg.Ports.Postgres,
		Durable: cfg.Durable,
		BinDir:  cfg.PostgresBinDir,
	}, e.logger.With("component", "postgres"))
	if errors.Is(err, localpg.ErrNotInstalled) {
		return e.startPostgresContainer(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("local postgres (set DATABASE_URL to use a server of your own): %w", err)
	}
	e.cluster = cluster
	return func(database string) string { return cluster.URL(cmp.Or(database, "postgres")) }, nil
}

// startPostgresContainer runs PostgreSQL in a Docker container, for want
// of an installation, and says so.
func (e *Env) startPostgresContainer(ctx context.Context, cfg Config) (func(database string) string, error) {
	image := cmp.Or(cfg.PostgresImage, DefaultPostgresImage)
	c, err := startPostgresContainer(ctx, image, cfg.Host, cfg.Ports.Postgres, cfg.Durable)
	if err != nil {
		return nil, err
	}
	e.container = c
	e.logger.InfoContext(ctx, "no PostgreSQL installation: PostgreSQL runs in a Docker container, removed on exit",
		"image", image, "container", c.id[:min(12, len(c.id))])
	return serverURLs(c.adminURL)
}

// dir returns dataDir/name, created if missing, or a new temporary
// directory that Stop removes.
func (e *Env) dir(dataDir, name string) (string, error) {
	if dataDir == "" {
		dir, err := os.MkdirTemp("", "onceflow-"+name+"-")
		if err != nil {
			return "", fmt.Errorf("create %s directory: %w", name, err)
		}
		e.tempDirs = append(e.tempDirs, dir)
		return dir, nil
	}
	dir := filepath.Join(dataDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	return dir, nil
}

// natsSyncAlways tells whether the embedded JetStream fsyncs every write.
func (cfg Config) natsSyncAlways() bool {
	return cfg.NATSSync == NATSSyncAlways || cfg.NATSSync == NATSSyncAuto && cfg.Durable
}

// servicesEnviron is the environment every service starts from: cfg.Environ,
// with R3 streams on a cluster and the outbox relays publishing one message
// at a time unless JetStream fsyncs every write, where Environ does not say
// otherwise. An atomic batch saves the
// fsyncs of a server that syncs every write; on the default interval it
// only costs (docs/performance.md).
func servicesEnviron(cfg Config) map[string]string {
	defaults := map[string]string{}
	if cfg.ClusterNodes > 1 {
		defaults["STREAM_REPLICAS"] = strconv.Itoa(min(cfg.ClusterNodes, 3))
	}
	if !cfg.natsSyncAlways() {
		defaults["OUTBOX_ATOMIC_BATCH_MIN"] = "0"
	}
	return overlay(defaults, environMap(cfg.Environ))
}

// environMap turns "KEY=value" entries into a map; the last one wins, as in
// exec.Cmd.Env.
func environMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// overlay returns a copy of base with over applied.
func overlay(base, over map[string]string) map[string]string {
	m := make(map[string]string, len(base)+len(over))
	maps.Copy(m, base)
	maps.Copy(m, over)
	return m
}

// natsLogger sends the embedded server's log to slog. Its notices (the
// start-up banner) are debug-level: dev prints where NATS is itself.
type natsLogger struct{ logger *slog.Logger }

func (l natsLogger) Noticef(format string, v ...any) { l.logger.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Warnf(format string, v ...any)   { l.logger.Warn(fmt.Sprintf(format, v...)) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.logger.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Errorf(format string, v ...any)  { l.logger.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Debugf(format string, v ...any)  { l.logger.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Tracef(format string, v ...any)  { l.logger.Debug(fmt.Sprintf(format, v...)) }

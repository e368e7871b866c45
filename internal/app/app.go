package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/httpserve"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// Deps are the connections a service builds its Spec from.
type Deps struct {
	Pool     *pgxpool.Pool
	Logger   *slog.Logger
	Registry *prometheus.Registry
}

// Subscription binds a durable consumer of the topology to a handler. The
// durable's stream and subjects are the topology's (internal/streams).
type Subscription struct {
	Durable string
	Handler inbox.Handler
	// Batched opts the subscription into the fast path: a batch of
	// messages per transaction (inbox.Config.Batched). Without it, each
	// message is processed in a transaction of its own, the reference
	// path. Config.ConsumerBatched overrides it.
	Batched bool
	// BatchHandler, when set, is the Handler's set-based form for a
	// Batched subscription (see inbox.BatchHandler);
	// Config.ConsumerSetBased turns it off.
	BatchHandler inbox.BatchHandler
}

// Spec is what a service adds to the shared runtime.
type Spec struct {
	// Subscriptions are durables of the topology (streams.Saga) whose
	// Service is the service's name; `onceflow provision` creates them.
	Subscriptions []Subscription
	// Routes registers the service's HTTP routes. Every route needs a
	// verified bearer token (auth.Caller has its identity) except the
	// platform's probes, metrics and /openapi.yaml, and Public.
	Routes func(e *echo.Echo)
	// Public are the service's routes anyone may call, as "METHOD path"
	// in echo's syntax, e.g. "GET /products/:sku".
	Public []string
	// Background loops run beside the consumers and end with ctx.
	Background []func(ctx context.Context) error
	// PipelinedRelay runs the outbox relay with two batches in flight
	// (outbox.RelayConfig.Pipelined) instead of the plain loop.
	PipelinedRelay bool
}

// Run runs the service name until ctx is done, in four named steps:
// connect (the database, migrated, and NATS, as the service's own
// identity), newService (the service's Spec from build, and the
// consumers, relay and HTTP server around it), serve (everything runs until
// ctx ends; the consumers once `onceflow provision` has created their
// durables, /readyz saying so meanwhile) and shutdown (stop in the order
// that loses nothing).
func Run(ctx context.Context, name string, cfg Config, logger *slog.Logger, build func(Deps) (Spec, error)) (err error) {
	// Records logged with a context carry its trace id and event ids.
	logger = slog.New(telemetry.NewLogHandler(logger.Handler())).With("service", name)

	tp, stopTracing, err := startTracing(ctx, cfg, name)
	if err != nil {
		return err
	}
	// Last, so that the spans of the shutdown are exported too.
	defer func() { err = errors.Join(err, stopTracing()) }()

	c, err := connect(ctx, name, cfg, logger)
	if err != nil {
		return err
	}
	// Closes what a failed newService leaves open; shutdown closes it in order.
	defer c.close()

	s, err := newService(ctx, name, cfg, c, tp, logger, build)
	if err != nil {
		return err
	}
	logger.Info("service started", "http", s.ln.Addr().String(), "nats", cfg.NATSURL, "subscriptions", len(s.consumers))
	stopRelay := s.startRelay(ctx)
	err = s.serve(ctx)
	return errors.Join(err, s.shutdown(ctx, stopRelay))
}

// startTracing returns the tracer provider of the service and the function
// that flushes and stops it: Config.TracerProvider, which is not Run's to
// stop, or the one Config.Tracing describes.
func startTracing(ctx context.Context, cfg Config, name string) (trace.TracerProvider, func() error, error) {
	if cfg.TracerProvider != nil {
		return cfg.TracerProvider, func() error { return nil }, nil
	}
	tp, shutdown, err := newTracerProvider(ctx, cfg.Tracing, name)
	if err != nil {
		return nil, nil, err
	}
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			return fmt.Errorf("shut down tracing: %w", err)
		}
		return nil
	}
	return tp, stop, nil
}

// conns are a service's connections.
type conns struct {
	// pool serves the HTTP handlers, the service's background loops, the
	// partition maintenance and the idempotency keys' cleaner.
	pool *pgxpool.Pool
	// workPool serves the consumers and the relay; newService opens it once
	// it knows how many consumers there are.
	workPool *pgxpool.Pool
	nc       *nats.Conn
	js       jetstream.JetStream
}

// close closes every connection open; closing twice is harmless.
func (c *conns) close() {
	if c.workPool != nil {
		c.workPool.Close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
	if c.pool != nil {
		c.pool.Close()
	}
}

// connect opens the service's pool and migrates its schema, then connects to
// NATS; the saga's streams and durables are `onceflow provision`'s.
func connect(ctx context.Context, name string, cfg Config, logger *slog.Logger) (_ *conns, err error) {
	c := &conns{}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if err := postgres.MigrateService(ctx, cfg.DatabaseURL, name, logger); err != nil {
		return nil, err
	}
	// pgx's default size, the number of CPUs (at least 4), is too small for
	// concurrent requests on a small machine; pool_max_conns in DATABASE_URL
	// still wins. A request waits for a connection and for each statement
	// a bounded time, and is refused with a 503 after it (httpapi).
	c.pool, err = postgres.Connect(ctx, cfg.DatabaseURL, func(pc *pgxpool.Config) {
		if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
			pc.MaxConns = cfg.DatabaseMaxConns
		}
	}, postgres.WithTimeouts(postgres.Timeouts{Statement: cfg.DatabaseStatementTimeout, Acquire: cfg.DatabaseAcquireTimeout}))
	if err != nil {
		return nil, err
	}

	c.nc, err = nats.Connect(cfg.NATSURL, append(cfg.natsClient().Options(name),
		nats.Name("onceflow-"+name),
		// The handshake's default of 2s fails a start on a loaded machine.
		nats.Timeout(10*time.Second),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { logger.Info("nats reconnected") }),
	)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", cfg.NATSURL, err)
	}
	// Bound how long the client keeps an unacknowledged async publish, so
	// that a relay batch that timed out does not fill its pending window.
	c.js, err = jetstream.New(c.nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return c, nil
}

// service is a service built and ready to serve.
type service struct {
	*conns
	cfg       Config
	logger    *slog.Logger
	spec      Spec
	relay     *outbox.Relay
	consumers []*inbox.Consumer
	prov      *provisioned
	// partitions observes the partition maintenance (partitions.go).
	partitions partitionObserver
	srv        *http.Server
	ln         net.Listener
}

// newService builds the service's Spec, and builds
// the relay, one inbox consumer per subscription, the metrics and the HTTP
// server around it.
func newService(ctx context.Context, name string, cfg Config, c *conns, tp trace.TracerProvider, logger *slog.Logger, build func(Deps) (Spec, error)) (*service, error) {
	registry := prometheus.NewRegistry()
	if err := errors.Join(
		registry.Register(collectors.NewGoCollector()),
		registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
	); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	m, err := newMetrics(registry)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	spec, err := build(Deps{Pool: c.pool, Logger: logger, Registry: registry})
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", name, err)
	}
	if err := inTopology(name, spec.Subscriptions); err != nil {
		return nil, err
	}

	// The consumers and the relay drain the saga; they get connections of
	// their own, one per consumer worker and two for the relay (its batches and
	// the lag collector), so that a burst of HTTP requests queues at the
	// edge instead of starving them.
	c.workPool, err = postgres.Connect(ctx, cfg.DatabaseURL, func(pc *pgxpool.Config) {
		pc.MaxConns = int32(len(spec.Subscriptions)*max(cfg.ConsumerWorkers, 1) + 2)
	}, postgres.WithTimeouts(postgres.Timeouts{Statement: cfg.DatabaseStatementTimeout}))
	if err != nil {
		return nil, err
	}
	s := &service{conns: c, cfg: cfg, logger: logger, spec: spec, prov: newProvisioned(spec.Subscriptions)}
	if s.partitions, err = newPartitionObserver(registry); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.relay = outbox.NewRelay(c.workPool, c.js, outbox.RelayConfig{
		BatchSize:      cfg.OutboxBatchSize,
		Pipelined:      spec.PipelinedRelay,
		PollInterval:   cfg.OutboxPollInterval,
		AtomicBatchMin: cfg.OutboxAtomicBatchMin,
		Observer:       relayObserver{m},
		TracerProvider: tp,
	}, logger)
	s.consumers = newConsumers(c.workPool, c.js, cfg, spec.Subscriptions, m, tp, logger)
	if err := errors.Join(
		registry.Register(newStatsCollector(s.relay)),
		registry.Register(newPoolCollector(c.pool, "http")),
		registry.Register(newPoolCollector(c.workPool, "consumers")),
	); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	observe, err := httpapi.Observe(registry, tp)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	verifier, err := auth.NewVerifier(ctx, cfg.Auth, logger)
	if err != nil {
		return nil, err
	}
	s.srv = newHTTPServer(cfg, logger, c.pool, c.nc, s.prov, registry, []echo.MiddlewareFunc{observe, verifier.Middleware(public(spec.Public))}, spec.Routes)
	if s.ln = cfg.HTTPListener; s.ln == nil {
		if s.ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
		}
	}
	return s, nil
}

// newConsumers returns one inbox consumer per subscription.
func newConsumers(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, subs []Subscription, m *metrics, tp trace.TracerProvider, logger *slog.Logger) []*inbox.Consumer {
	topology := saga()
	consumers := make([]*inbox.Consumer, len(subs))
	for i, sub := range subs {
		if !cfg.ConsumerSetBased {
			sub.BatchHandler = nil
		}
		if cfg.ConsumerBatched != nil {
			sub.Batched = *cfg.ConsumerBatched
		}
		observer := m.consumer(sub.Durable, tp)
		observer.afterCommit = killAfterCommit(cfg.FaultKillAfterCommit, logger)
		consumers[i] = inbox.New(pool, js, inbox.Config{
			Stream:       streamOf(topology, sub.Durable),
			Durable:      sub.Durable,
			BatchSize:    cfg.ConsumerBatchSize,
			Batched:      sub.Batched,
			BatchHandler: sub.BatchHandler,
			Workers:      cfg.ConsumerWorkers,
			Retention:    cfg.InboxRetention,
			Observer:     observer,
			Topology:     &topology,
		}, sub.Handler, logger)
	}
	return consumers
}

// saga is the topology the services' durables are declared in.
func saga() streams.Topology { return streams.Saga(streams.Config{}) }

// inTopology tells whether each of service's subscriptions is a durable
// the topology gives it: the topology says its stream and subjects, and
// `onceflow provision` creates only those.
func inTopology(service string, subs []Subscription) error {
	topology := saga()
	for _, sub := range subs {
		c, ok := topology.Consumer(sub.Durable)
		switch {
		case !ok:
			return fmt.Errorf("subscription %s: no such durable in the topology (internal/streams)", sub.Durable)
		case c.Service != service:
			return fmt.Errorf("subscription %s: the topology gives the durable to %s, not %s", sub.Durable, c.Service, service)
		}
	}
	return nil
}

// streamOf is the stream of durable, a durable of topology.
func streamOf(topology streams.Topology, durable string) string {
	c, _ := topology.Consumer(durable)
	return c.Stream
}

// startRelay runs the relay on a context of its own: it outlives the
// consumers and the HTTP server, so that what they wrote while stopping is
// still published. The function it returns stops the relay and returns how
// it ended.
func (s *service) startRelay(ctx context.Context) (stop func() error) {
	relayCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- s.relay.Run(relayCtx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// serve runs the consumers (once their durables exist), the service's background loops, the partition maintenance, the idempotency cleaner and
// the HTTP server until ctx ends (or one of them fails), and returns once
// they have all stopped.
func (s *service) serve(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if s.prov.wait(gctx, s.js, s.logger); gctx.Err() != nil {
			return nil
		}
		for _, c := range s.consumers {
			g.Go(func() error { return c.Run(gctx) })
		}
		return nil
	})
	for _, loop := range s.spec.Background {
		g.Go(func() error { return loop(gctx) })
	}
	g.Go(func() error { return maintenance(s).Run(gctx) })
	g.Go(func() error {
		return idempotency.NewCleaner(s.pool, s.cfg.IdempotencyRetention, 0, s.logger).Run(gctx)
	})
	g.Go(func() error {
		if err := httpserve.Serve(gctx, s.srv, s.ln, s.cfg.ShutdownTimeout, s.logger); err != nil {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// shutdown stops the service once serve has returned, in the order that
// loses nothing: the consumers and the HTTP server have stopped writing; the
// relay stops and flushes what they wrote while stopping; NATS drains, so
// that the last publishes are acknowledged; the pools close.
func (s *service) shutdown(ctx context.Context, stopRelay func() error) error {
	err := stopRelay()
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if n, ferr := s.relay.Flush(flushCtx); ferr != nil {
		err = errors.Join(err, fmt.Errorf("final outbox flush: %w", ferr))
	} else if n > 0 {
		s.logger.Info("outbox flushed at shutdown", "published", n)
	}
	if derr := s.nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
		err = errors.Join(err, fmt.Errorf("drain nats: %w", derr))
	}
	s.logger.Info("service stopped")
	s.close()
	return err
}

// public tells the routes anyone may call: the platform's and the service's
// own.
func public(routes []string) func(echo.Context) bool {
	open := map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true, "GET /openapi.yaml": true}
	for _, r := range routes {
		open[r] = true
	}
	return func(c echo.Context) bool { return open[c.Request().Method+" "+c.Path()] }
}

func newHTTPServer(cfg Config, logger *slog.Logger, pool *pgxpool.Pool, nc *nats.Conn, prov *provisioned, registry *prometheus.Registry, mw []echo.MiddlewareFunc, routes func(*echo.Echo)) *http.Server {
	e := httpapi.New(logger, mw...)
	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/readyz", func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		// The answer names what is down, never its error: an error's text
		// (an address, a role) is for the logs, not for whoever can reach
		// the probe.
		if err := pool.Ping(ctx); err != nil {
			logger.WarnContext(ctx, "readiness: database unreachable", "err", err)
			return httpapi.NewProblem(http.StatusServiceUnavailable, "the database is unreachable")
		}
		if !nc.IsConnected() {
			return httpapi.NewProblem(http.StatusServiceUnavailable, "nats is not connected")
		}
		if err := prov.ready(); err != nil {
			return httpapi.NewProblem(http.StatusServiceUnavailable, "streams: %v", err)
		}
		return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
	})
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry})))
	if routes != nil {
		routes(e)
	}
	return &http.Server{
		Handler:           e,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// killAfterCommit is the fault hook behind FaultKillAfterCommit: a real
// SIGKILL, so nothing is flushed or acked on the way out.
func killAfterCommit(probability float64, logger *slog.Logger) func(event.Envelope) {
	if probability <= 0 {
		return nil
	}
	return func(ev event.Envelope) {
		if rand.Float64() < probability {
			logger.Warn("fault injection: killing the process between commit and ack", "event_id", ev.ID)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
}

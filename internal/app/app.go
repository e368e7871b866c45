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
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
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

// Subscription binds a durable consumer of the topology to a handler.
type Subscription struct {
	Stream, Durable string
	Handler         inbox.Handler
	// BatchHandler, when set, is the Handler's set-based form for batched
	// consumers (see inbox.BatchHandler); Config.ConsumerSetBased turns it off.
	BatchHandler inbox.BatchHandler
}

// Spec is what a service adds to the shared runtime.
type Spec struct {
	Subscriptions []Subscription
	// Consumers are durable consumers the service adds to the saga's
	// topology (streams.Saga) for its own subscriptions, provisioned before
	// they start: how a service added later brings its durables along.
	Consumers []streams.Consumer
	// Routes registers the service's HTTP routes.
	Routes func(e *echo.Echo)
	// Background loops run beside the consumers and end with ctx.
	Background []func(ctx context.Context) error
}

// Run runs the service name until ctx is done. build receives the
// connections once the database is migrated and the streams provisioned.
func Run(ctx context.Context, name string, cfg Config, logger *slog.Logger, build func(Deps) (Spec, error)) (err error) {
	// Records logged with a context carry its trace id and event ids.
	logger = slog.New(telemetry.NewLogHandler(logger.Handler())).With("service", name)

	tp := cfg.TracerProvider
	if tp == nil {
		var shutdown func(context.Context) error
		if tp, shutdown, err = newTracerProvider(ctx, cfg.Tracing, name); err != nil {
			return err
		}
		defer func() {
			// Last, so that the spans of the shutdown are exported too.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
			defer cancel()
			if serr := shutdown(sctx); serr != nil {
				err = errors.Join(err, fmt.Errorf("shut down tracing: %w", serr))
			}
		}()
	}

	// The pool of the HTTP handlers, the service's background loops and the
	// cleaners. pgx's default size, the number of CPUs (at least 4), is too
	// small for concurrent requests on a small machine; pool_max_conns in
	// DATABASE_URL still wins.
	pool, err := postgres.Connect(ctx, cfg.DatabaseURL, func(pc *pgxpool.Config) {
		if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
			pc.MaxConns = cfg.DatabaseMaxConns
		}
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, err := postgres.ServiceSchema(name)
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, pool, schema, logger); err != nil {
		return err
	}

	nc, err := nats.Connect(cfg.NATSURL,
		nats.Name("onceflow-"+name),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { logger.Info("nats reconnected") }),
	)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", cfg.NATSURL, err)
	}
	defer nc.Close()
	// Bound how long the client keeps an unacknowledged async publish, so
	// that a relay batch that timed out does not fill its pending window.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := streams.Provision(ctx, js, streams.Saga(cfg.Streams())); err != nil {
		return err
	}

	registry := prometheus.NewRegistry()
	if err := errors.Join(
		registry.Register(collectors.NewGoCollector()),
		registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
	); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	m, err := newMetrics(registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	spec, err := build(Deps{Pool: pool, Logger: logger, Registry: registry})
	if err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}
	if err := streams.Provision(ctx, js, streams.Topology{Config: cfg.Streams(), Consumers: spec.Consumers}); err != nil {
		return err
	}

	// The consumers and the relay drain the saga; they get connections of
	// their own, one per consumer worker and two for the relay (its batches and
	// the lag collector), so that a burst of HTTP requests queues at the
	// edge instead of starving them.
	workPool, err := postgres.Connect(ctx, cfg.DatabaseURL, func(pc *pgxpool.Config) {
		pc.MaxConns = int32(len(spec.Subscriptions)*max(cfg.ConsumerWorkers, 1) + 2)
	})
	if err != nil {
		return err
	}
	defer workPool.Close()

	relay := outbox.NewRelay(workPool, js, outbox.RelayConfig{
		BatchSize:      cfg.OutboxBatchSize,
		PollInterval:   cfg.OutboxPollInterval,
		AtomicBatchMin: cfg.OutboxAtomicBatchMin,
		Observer:       relayObserver{m},
		TracerProvider: tp,
	}, logger)
	consumers := make([]*inbox.Consumer, len(spec.Subscriptions))
	for i, sub := range spec.Subscriptions {
		if !cfg.ConsumerSetBased {
			sub.BatchHandler = nil
		}
		consumers[i] = inbox.New(workPool, js, inbox.Config{
			Stream:       sub.Stream,
			Durable:      sub.Durable,
			BatchSize:    cfg.ConsumerBatchSize,
			Batched:      cfg.ConsumerBatched,
			BatchHandler: sub.BatchHandler,
			Workers:      cfg.ConsumerWorkers,
			Retention:    cfg.InboxRetention,
			AfterCommit:  killAfterCommit(cfg.FaultKillAfterCommit, logger),
			Observer:     m.consumer(sub.Durable, tp),
		}, sub.Handler, logger)
	}
	if err := errors.Join(
		registry.Register(newStatsCollector(relay)),
		registry.Register(newPoolCollector(pool, "http")),
		registry.Register(newPoolCollector(workPool, "consumers")),
	); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	observe, err := httpapi.Observe(registry, tp)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}

	srv := newHTTPServer(cfg, logger, pool, nc, registry, observe, spec.Routes)
	ln := cfg.HTTPListener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
		}
	}
	logger.Info("service started", "http", ln.Addr().String(), "nats", cfg.NATSURL, "subscriptions", len(consumers))

	// The relay outlives the consumers and the HTTP server, so that what they
	// wrote while stopping is still published.
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	for _, c := range consumers {
		g.Go(func() error { return c.Run(gctx) })
	}
	for _, loop := range spec.Background {
		g.Go(func() error { return loop(gctx) })
	}
	g.Go(func() error {
		return inbox.NewCleaner(pool, inbox.CleanerConfig{Retention: cfg.InboxRetention}, logger).Run(gctx)
	})
	g.Go(func() error {
		return outbox.NewCleaner(pool, outbox.CleanerConfig{Retention: cfg.OutboxRetention}, logger).Run(gctx)
	})
	g.Go(func() error {
		return idempotency.NewCleaner(pool, cfg.IdempotencyRetention, 0, logger).Run(gctx)
	})
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(gctx), cfg.ShutdownTimeout)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
	runErr := g.Wait()

	stopRelay()
	err = errors.Join(runErr, <-relayDone)
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if n, ferr := relay.Flush(flushCtx); ferr != nil {
		err = errors.Join(err, fmt.Errorf("final outbox flush: %w", ferr))
	} else if n > 0 {
		logger.Info("outbox flushed at shutdown", "published", n)
	}
	if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
		err = errors.Join(err, fmt.Errorf("drain nats: %w", derr))
	}
	logger.Info("service stopped")
	return err
}

func newHTTPServer(cfg Config, logger *slog.Logger, pool *pgxpool.Pool, nc *nats.Conn, registry *prometheus.Registry, observe echo.MiddlewareFunc, routes func(*echo.Echo)) *http.Server {
	e := httpapi.New(logger, observe)
	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/readyz", func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			return httpapi.NewProblem(http.StatusServiceUnavailable, "database: %v", err)
		}
		if !nc.IsConnected() {
			return httpapi.NewProblem(http.StatusServiceUnavailable, "nats: %s", nc.Status())
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

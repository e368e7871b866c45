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
}

// Spec is what a service adds to the shared runtime.
type Spec struct {
	Subscriptions []Subscription
	// Routes registers the service's HTTP routes.
	Routes func(e *echo.Echo)
	// Background loops run beside the consumers and end with ctx.
	Background []func(ctx context.Context) error
}

// Run runs the service name until ctx is done. build receives the
// connections once the database is migrated and the streams provisioned.
func Run(ctx context.Context, name string, cfg Config, logger *slog.Logger, build func(Deps) (Spec, error)) error {
	logger = logger.With("service", name)

	pool, err := postgres.Connect(ctx, cfg.DatabaseURL)
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
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	spec, err := build(Deps{Pool: pool, Logger: logger, Registry: registry})
	if err != nil {
		return fmt.Errorf("build %s: %w", name, err)
	}

	relay := outbox.NewRelay(pool, js, outbox.RelayConfig{
		BatchSize:    cfg.OutboxBatchSize,
		PollInterval: cfg.OutboxPollInterval,
	}, logger)
	consumers := make([]*inbox.Consumer, len(spec.Subscriptions))
	for i, sub := range spec.Subscriptions {
		consumers[i] = inbox.New(pool, js, inbox.Config{
			Stream:      sub.Stream,
			Durable:     sub.Durable,
			BatchSize:   cfg.ConsumerBatchSize,
			Batched:     cfg.ConsumerBatched,
			Workers:     cfg.ConsumerWorkers,
			Retention:   cfg.InboxRetention,
			AfterCommit: killAfterCommit(cfg.FaultKillAfterCommit, logger),
		}, sub.Handler, logger.With("consumer", sub.Durable))
	}
	registry.MustRegister(newCollector(relay, consumers, spec.Subscriptions))

	srv := newHTTPServer(cfg, logger, pool, nc, registry, spec.Routes)
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

func newHTTPServer(cfg Config, logger *slog.Logger, pool *pgxpool.Pool, nc *nats.Conn, registry *prometheus.Registry, routes func(*echo.Echo)) *http.Server {
	e := httpapi.New(logger)
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

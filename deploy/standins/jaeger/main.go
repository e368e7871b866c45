// Command jaeger is the compose demo's offline stand-in for Jaeger's
// all-in-one image (deploy/standins/build.sh builds it into
// onceflow-standin/jaeger), for an engine that can pull no image. Jaeger
// itself builds from its Go module, but in about 7 minutes of CPU (all its
// storage back ends come along), and without its UI, which needs npm.
//
// It honours the part of the all-in-one's contract the demo relies on: it
// receives traces over OTLP, HTTP on 4318 (POST /v1/traces, protobuf or
// JSON) and gRPC on 4317, keeps them in memory (the newest
// MEMORY_MAX_TRACES, 100000 by default), and answers the query API on
// 16686 in Jaeger's JSON: /api/services, /api/services/<service>/operations,
// /api/traces (service, operation, tags, start, end, lookback, limit) and
// /api/traces/<id>; 14269 answers Jaeger's health check. It has no UI, no
// Zipkin, Thrift or Jaeger-protocol receivers, no sampling endpoint and no
// storage but memory.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/onceflow/onceflow/internal/httpserve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := configFromEnv(os.Getenv)
	if err == nil {
		err = run(ctx, cfg, logger)
	}
	if err != nil {
		logger.Error("jaeger stand-in", "err", err)
		stop()
		os.Exit(1)
	}
}

// config is the stand-in's addresses, Jaeger's defaults, and its memory.
type config struct {
	otlpHTTP, otlpGRPC, query, admin string
	maxTraces                        int
}

func configFromEnv(getenv func(string) string) (config, error) {
	cfg := config{otlpHTTP: ":4318", otlpGRPC: ":4317", query: ":16686", admin: ":14269", maxTraces: 100_000}
	if s := getenv("MEMORY_MAX_TRACES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return config{}, fmt.Errorf("MEMORY_MAX_TRACES %q: want a positive number", s)
		}
		cfg.maxTraces = n
	}
	return cfg, nil
}

// run serves the receivers, the query API and the health check until ctx
// ends or one of them fails.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	st := newStore(cfg.maxTraces)
	handlers := map[string]http.Handler{
		cfg.otlpHTTP: otlpHandler(st, logger),
		cfg.query:    queryHandler(st),
		cfg.admin:    http.HandlerFunc(health),
	}
	listeners := map[string]net.Listener{}
	for _, addr := range []string{cfg.otlpHTTP, cfg.query, cfg.admin, cfg.otlpGRPC} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("listen: %w", err)
		}
		listeners[addr] = ln
	}
	g, ctx := errgroup.WithContext(ctx)
	for addr, h := range handlers {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error { return httpserve.Serve(ctx, srv, listeners[addr], 5*time.Second, logger) })
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, grpcReceiver{st: st})
	g.Go(func() error {
		if err := gs.Serve(listeners[cfg.otlpGRPC]); err != nil {
			return fmt.Errorf("otlp grpc: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		gs.GracefulStop()
		return nil
	})
	logger.Info("jaeger stand-in: OTLP in, the query API out, no UI", "otlp_http", cfg.otlpHTTP, "otlp_grpc", cfg.otlpGRPC, "query", cfg.query)
	return g.Wait()
}

// health is the admin port's answer, as Jaeger's.
func health(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, `{"status":"Server available"}`)
}

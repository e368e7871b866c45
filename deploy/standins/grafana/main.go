// Command grafana is the compose demo's offline stand-in for Grafana
// (deploy/standins/build.sh builds it into onceflow-standin/grafana), for
// an engine that can pull no image: Grafana's frontend needs npm to build
// and its backend is far too big to build here.
//
// It honours the part of Grafana's contract the demo relies on, and no
// more: it listens on GF_SERVER_HTTP_PORT (3000), reads the data sources
// and the file dashboard providers under GF_PATHS_PROVISIONING
// (/etc/grafana/provisioning) and the dashboards they point at, and
// answers Grafana's HTTP API for them: /api/health, /api/search,
// /api/dashboards/uid/<uid>, /api/dashboards/home
// (GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH), /api/datasources and the
// data source proxy /api/datasources/proxy/uid/<uid>/<path>, through which
// a dashboard panel's query is run against Prometheus. It has no UI (no
// panels are drawn), no users, no sign-in, no alerting and nothing stored:
// every visitor is an anonymous viewer.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/httpserve"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(ctx, configFromEnv(os.Getenv), logger); err != nil {
		logger.Error("grafana stand-in", "err", err)
		stop()
		os.Exit(1)
	}
}

// config is what the stand-in reads from Grafana's environment variables.
type config struct {
	addr         string // GF_SERVER_HTTP_ADDR:GF_SERVER_HTTP_PORT
	provisioning string // GF_PATHS_PROVISIONING
	homePath     string // GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH
}

func configFromEnv(getenv func(string) string) config {
	return config{
		addr:         net.JoinHostPort(getenv("GF_SERVER_HTTP_ADDR"), cmp.Or(getenv("GF_SERVER_HTTP_PORT"), "3000")),
		provisioning: cmp.Or(getenv("GF_PATHS_PROVISIONING"), "/etc/grafana/provisioning"),
		homePath:     getenv("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"),
	}
}

// run loads the provisioning and serves the API until ctx ends.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	prov, err := loadProvisioning(cfg.provisioning, os.Getenv)
	if err != nil {
		return err
	}
	for _, d := range prov.dashboards {
		logger.Info("dashboard provisioned", "uid", d.uid, "title", d.title, "file", d.file)
	}
	for _, ds := range prov.datasources {
		logger.Info("data source provisioned", "uid", ds.UID, "name", ds.Name, "url", ds.URL)
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	logger.Info("grafana stand-in: the HTTP API only, no UI", "addr", ln.Addr().String())
	srv := &http.Server{Handler: newServer(prov, cfg.homePath, logger), ReadHeaderTimeout: 10 * time.Second}
	return httpserve.Serve(ctx, srv, ln, 5*time.Second, logger)
}

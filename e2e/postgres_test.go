package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/testenv"
)

// pgServer is the PostgreSQL server of the suite. Each scenario creates its
// four databases on it and drops them afterwards.
type pgServer struct {
	// source says which server this is, for the log.
	source   string
	adminURL *url.URL
	admin    *pgxpool.Pool
	// cluster is the local cluster, nil for a container or TEST_DATABASE_URL.
	// Only a local cluster can be restarted in place: a restarted container
	// may come back on another host port.
	cluster *localpg.Cluster
	stopFn  func(context.Context) error
	// replicated, when set, waits until what was just written is on every
	// node of a highly available server: pgx gives up a multi-host
	// connection at a standby that has not replayed its database yet.
	replicated func(context.Context) error
}

// startPostgres starts the server: TEST_DATABASE_URL's if set, else a
// container when a Docker engine answers, else a durable local cluster.
func startPostgres(ctx context.Context, logger *slog.Logger) (*pgServer, error) {
	s := &pgServer{stopFn: func(context.Context) error { return nil }}
	var (
		adminURL string
		err      error
	)
	if adminURL = os.Getenv("TEST_DATABASE_URL"); adminURL != "" {
		s.source = "TEST_DATABASE_URL"
	} else {
		var choice testenv.ContainerChoice
		choice, err = testenv.ChooseContainers(ctx, testenv.PostgresImage())
		switch {
		case err != nil:
		case choice.Use:
			adminURL, err = s.startContainer(ctx, choice.Reason)
		default:
			adminURL, err = s.startCluster(ctx, logger, choice.Reason)
		}
	}
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.Join(fmt.Errorf("%s: want a postgres:// URL", s.source), s.stopFn(ctx))
	}
	s.adminURL = u
	if s.admin, err = pgxpool.New(ctx, adminURL); err == nil {
		err = s.admin.Ping(ctx)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", s.source, err), s.stop(ctx))
	}
	fmt.Fprintf(os.Stderr, "e2e: postgres: %s at %s\n", s.source, u.Redacted())
	return s, nil
}

func (s *pgServer) startContainer(ctx context.Context, reason string) (string, error) {
	// The image's defaults: fsync and synchronous commit on.
	ctr, err := tcpostgres.Run(ctx, testenv.PostgresImage(),
		testcontainers.WithCmd("postgres", "-c", "max_connections=400"),
		tcpostgres.BasicWaitStrategies(),
		testenv.OnLoopback("5432/tcp"),
	)
	if err != nil {
		return "", errors.Join(fmt.Errorf("postgres container: %w", err), testcontainers.TerminateContainer(ctr))
	}
	s.stopFn = func(ctx context.Context) error {
		return testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
	}
	s.source = fmt.Sprintf("testcontainers %s (%s)", testenv.PostgresImage(), reason)
	adminURL, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", errors.Join(fmt.Errorf("postgres container: %w", err), s.stopFn(ctx))
	}
	return adminURL, nil
}

func (s *pgServer) startCluster(ctx context.Context, logger *slog.Logger, why string) (string, error) {
	// Durable: fsync and synchronous commit on, as in production; the
	// database restart scenario stops and starts it for real.
	cluster, err := localpg.Start(ctx, localpg.Config{Durable: true, MaxConnections: 400}, logger)
	if err != nil {
		return "", fmt.Errorf("local postgres cluster (no TEST_DATABASE_URL, no containers: %s): %w", why, err)
	}
	s.cluster, s.stopFn = cluster, cluster.Stop
	s.source = fmt.Sprintf("local durable cluster (no TEST_DATABASE_URL, no containers: %s)", why)
	return cluster.URL("postgres"), nil
}

func (s *pgServer) stop(ctx context.Context) error {
	if s.admin != nil {
		s.admin.Close()
	}
	return s.stopFn(ctx)
}

// url connects to database as the server's administrator.
func (s *pgServer) url(database string) string {
	u := *s.adminURL
	u.Path, u.RawPath = "/"+database, ""
	return u.String()
}

// addr is the server's host:port.
func (s *pgServer) addr() string { return s.adminURL.Host }

// urlVia is url(database) through addr instead of the server's own address,
// e.g. a fault-injecting proxy.
func (s *pgServer) urlVia(database, addr string) string {
	u, _ := url.Parse(s.url(database))
	u.Host = addr
	return u.String()
}

func (s *pgServer) createDatabase(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	if s.replicated != nil {
		if err := s.replicated(ctx); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
	}
	return nil
}

func (s *pgServer) dropDatabase(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// outage breaks every connection to databases as a database outage would:
// a local cluster is restarted (stopped, then started on the same data
// directory and port), or with crash set, its postmaster is killed with
// SIGKILL and started again, which runs crash recovery; another server has
// every backend of databases terminated. It says which it did.
func (s *pgServer) outage(ctx context.Context, databases []string, crash bool) (string, error) {
	if s.cluster != nil {
		how, stop := "restart", s.cluster.Restart
		if crash {
			how, stop = "kill_9_postmaster", s.cluster.Crash
		}
		if err := stop(ctx); err != nil {
			// Up again for the tests that follow, whatever this one's fate.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if rerr := s.cluster.Restart(rctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("and starting it again: %w", rerr))
			}
			s.admin.Reset()
			return "", err
		}
		// The admin pool's connections broke with the others.
		s.admin.Reset()
		return how, nil
	}
	_, err := s.terminateBackends(ctx, databases, "")
	return "terminate_backends", err
}

// terminateBackends terminates the backends of databases, only those of
// applicationName unless it is empty, and waits (up to 5 seconds each) for
// them to exit. It returns how many it terminated.
func (s *pgServer) terminateBackends(ctx context.Context, databases []string, applicationName string) (int, error) {
	var n int
	err := s.admin.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity
		WHERE datname = ANY($1) AND pid <> pg_backend_pid()
		  AND ($2 = '' OR application_name = $2)`,
		databases, applicationName).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("terminate backends of %v: %w", databases, err)
	}
	return n, nil
}

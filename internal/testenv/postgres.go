package testenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/postgres"
)

// Database is a database of its own for one test, migrated to a schema.
type Database struct {
	// Name is the database's name, a lowercase identifier.
	Name string
	// URL connects to the database.
	URL string
	// Pool is open on the database until the test ends.
	Pool *pgxpool.Pool

	server *pgServer
}

// NewDatabase creates a database migrated to schema, and drops it when the
// test ends. It is cheap: a copy of a template migrated once per schema.
func NewDatabase(t testing.TB, schema postgres.Schema) *Database {
	t.Helper()
	srv, err := shared.postgres()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx := t.Context()
	template, err := srv.template(ctx, schema)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	name := srv.newName("test", t.Name())
	if err := srv.createDatabase(ctx, name, template); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled here.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.dropDatabase(ctx, name); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})

	db := &Database{Name: name, URL: srv.url(name), server: srv}
	if db.Pool, err = postgres.Connect(ctx, db.URL); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(db.Pool.Close)
	return db
}

// NewServiceDatabase is NewDatabase with the migrations a service's
// database gets: the platform's, then the service's own ("" for the
// platform's alone).
func NewServiceDatabase(t testing.TB, service string) *Database {
	t.Helper()
	schema, err := postgres.ServiceSchema(service)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return NewDatabase(t, schema)
}

// CountingPool opens another pool on the database, closed when the test
// ends, and counts its round trips in trips: each statement sent on its
// own and each batch (a statement's preparation, once per connection, is
// not counted).
func (d *Database) CountingPool(t testing.TB) (pool *pgxpool.Pool, trips *atomic.Int64) {
	t.Helper()
	counter := &tripCounter{}
	cfg := d.Pool.Config()
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, &counter.n
}

// tripCounter is a pgx tracer that counts round trips.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// AdminURL connects to the server's maintenance database with the rights to
// create and drop databases.
func (d *Database) AdminURL() string {
	return d.server.adminURL.String()
}

// TerminateBackends breaks every connection to the database, as a database
// outage would, and waits (up to 5 seconds each) for the backends to exit.
// Pools notice on their next use of a broken connection.
func (d *Database) TerminateBackends(ctx context.Context) error {
	_, err := d.server.admin.Exec(ctx,
		`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
		d.Name)
	if err != nil {
		return fmt.Errorf("terminate backends of %s: %w", d.Name, err)
	}
	return nil
}

// Begin starts a transaction on db (a pool or a connection) that is rolled
// back when the test ends unless it ended before: a failed assertion then
// cannot leave it open, holding its locks, and its connection, which the
// pool's Close waits for, until the go test timeout. A Begin from a
// goroutine of the test is rolled back too.
func Begin(t testing.TB, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(t.Context())
	if err != nil {
		t.Fatalf("testenv: begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// pgServer is the PostgreSQL server of the test binary.
type pgServer struct {
	logger   *slog.Logger
	adminURL *url.URL
	admin    *pgxpool.Pool
	pid      int
	seq      atomic.Int64

	mu        sync.Mutex
	templates map[string]*template // by schema key
}

// template is a database migrated once and then only copied.
type template struct {
	once sync.Once
	name string
	err  error
}

// postgres returns the server, choosing and starting it on first use.
func (e *environment) postgres() (*pgServer, error) {
	if !e.running.Load() {
		return nil, errNoRun
	}
	e.pgOnce.Do(func() {
		e.pg, e.pgErr = e.startPostgres(context.Background())
	})
	return e.pg, e.pgErr
}

func (e *environment) startPostgres(ctx context.Context) (*pgServer, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // an image pull included
	defer cancel()

	var adminURL, source, reason string
	cfg := readSettings()
	choice, err := e.useContainers()
	if cfg.databaseURL == "" && err != nil {
		return nil, err
	}
	switch {
	case cfg.databaseURL != "":
		adminURL, source, reason = cfg.databaseURL, "TEST_DATABASE_URL", "TEST_DATABASE_URL is set"
	case choice.Use:
		ctr, err := tcpostgres.Run(ctx, PostgresImage(),
			testcontainers.WithCmd("postgres",
				"-c", "fsync=off",
				"-c", "synchronous_commit=off",
				"-c", "full_page_writes=off",
				"-c", "max_connections=300",
			),
			// Test data: initdb need not fsync either.
			testcontainers.WithEnv(map[string]string{"POSTGRES_INITDB_ARGS": "--no-sync"}),
			tcpostgres.BasicWaitStrategies(),
			OnLoopback("5432/tcp"),
		)
		e.markDockerUsed()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("postgres container: %w", err), testcontainers.TerminateContainer(ctr))
		}
		e.onTeardown(func(ctx context.Context) error {
			return testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
		})
		if adminURL, err = ctr.ConnectionString(ctx, "sslmode=disable"); err != nil {
			return nil, fmt.Errorf("postgres container: %w", err)
		}
		source, reason = "testcontainers "+PostgresImage(), "TEST_DATABASE_URL is unset and "+choice.Reason
	default:
		cluster, err := localpg.Start(ctx, localpg.Config{}, e.logger)
		if err != nil {
			return nil, fmt.Errorf("local postgres cluster (TEST_DATABASE_URL is unset, no containers: %s): %w", choice.Reason, err)
		}
		e.onTeardown(cluster.Stop)
		adminURL = cluster.URL("postgres")
		source, reason = "local cluster", "TEST_DATABASE_URL is unset, no containers: "+choice.Reason
	}

	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("%s: want a postgres:// URL", source)
	}
	e.logger.Info("postgres for tests", "source", source, "reason", reason, "url", u.Redacted())

	admin, err := postgres.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	srv := &pgServer{
		logger:    e.logger,
		adminURL:  u,
		admin:     admin,
		pid:       os.Getpid(),
		templates: make(map[string]*template),
	}
	e.onTeardown(srv.close)
	return srv, nil
}

// url is the URL of database name on the server.
func (s *pgServer) url(name string) string {
	u := *s.adminURL
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// newName returns a database name unique on the server: tests of several
// binaries may share it.
func (s *pgServer) newName(prefix, hint string) string {
	name := fmt.Sprintf("%s_%d_%d_%s", prefix, s.pid, s.seq.Add(1), sanitize(hint))
	if len(name) > 63 { // NAMEDATALEN-1
		name = name[:63]
	}
	return name
}

// sanitize maps s to lowercase letters, digits and underscores.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			return r
		case 'A' <= r && r <= 'Z':
			return r + ('a' - 'A')
		default:
			return '_'
		}
	}, s)
}

// template returns the name of the template database of schema, creating
// and migrating it on first use.
func (s *pgServer) template(ctx context.Context, schema postgres.Schema) (string, error) {
	key := schema.Key()
	s.mu.Lock()
	tmpl, ok := s.templates[key]
	if !ok {
		tmpl = &template{name: s.newName("tmpl", key)}
		s.templates[key] = tmpl
	}
	s.mu.Unlock()

	tmpl.once.Do(func() {
		// The template outlives the test that happens to create it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		tmpl.err = s.createTemplate(ctx, tmpl.name, schema)
	})
	return tmpl.name, tmpl.err
}

func (s *pgServer) createTemplate(ctx context.Context, name string, schema postgres.Schema) error {
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
		return fmt.Errorf("create template %s: %w", name, err)
	}
	pool, err := postgres.Connect(ctx, s.url(name))
	if err == nil {
		err = postgres.Migrate(ctx, pool, schema, s.logger)
		// No session may remain on a template that is being copied.
		pool.Close()
	}
	if err != nil {
		return errors.Join(fmt.Errorf("template of schema %q: %w", schema.Key(), err), s.dropDatabase(ctx, name))
	}
	s.logger.InfoContext(ctx, "template database ready", "schema", schema.Key(), "database", name)
	return nil
}

// createDatabase copies template into a new database name. The copy fails
// while a session is connected to the template, as for a moment after the
// migration pool is closed; it is retried for a few seconds.
func (s *pgServer) createDatabase(ctx context.Context, name, template string) error {
	const objectInUse = "55006"
	sql := "CREATE DATABASE " + ident(name) + " TEMPLATE " + ident(template)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil {
			return nil
		}
		if !errors.As(err, &pgErr) || pgErr.Code != objectInUse || time.Now().After(deadline) {
			return fmt.Errorf("create database %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create database %s: %w", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *pgServer) dropDatabase(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// close drops the templates, which matters on a server that outlives the
// tests, and closes the admin pool.
func (s *pgServer) close(ctx context.Context) error {
	defer s.admin.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, tmpl := range s.templates {
		errs = append(errs, s.dropDatabase(ctx, tmpl.name))
	}
	return errors.Join(errs...)
}

func ident(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// NewPlatformDatabaseAt returns a fresh database with the platform
// migrations up to version, as a previous release left it, and the goose
// provider that takes it further (UpTo, DownTo): for tests of migrations
// on rows an older schema wrote.
func NewPlatformDatabaseAt(t testing.TB, version int64) (*Database, *goose.Provider) {
	t.Helper()
	d := NewDatabase(t, postgres.Schema{})
	platform, err := db.Migrations(db.Platform)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	sqlDB := stdlib.OpenDBFromPool(d.Pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, platform,
		goose.WithTableName("goose_platform_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if _, err := provider.UpTo(context.Background(), version); err != nil {
		t.Fatalf("testenv: migrate platform to %d: %v", version, err)
	}
	return d, provider
}

package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/onceflow/onceflow/db"
)

// MigrationSet is one independently versioned directory of goose migrations.
type MigrationSet struct {
	Name string
	FS   fs.FS
}

// Schema is the migration sets of one database, applied in order.
type Schema []MigrationSet

// Key names the schema, e.g. "platform+payment"; test templates are keyed by it.
func (s Schema) Key() string {
	names := make([]string, len(s))
	for i, set := range s {
		names[i] = set.Name
	}
	return strings.Join(names, "+")
}

// ServiceSchema is the schema of a service database: the platform set, then
// the service's own set named after the service. With no service name it is
// the platform set alone.
func ServiceSchema(service string) (Schema, error) {
	names := []string{db.Platform}
	if service != "" {
		names = append(names, service)
	}
	schema := make(Schema, 0, len(names))
	for _, name := range names {
		fsys, err := db.Migrations(name)
		if err != nil {
			return nil, err
		}
		schema = append(schema, MigrationSet{Name: name, FS: fsys})
	}
	return schema, nil
}

// Connect opens a pool to url, adjusted by configure, and checks that the
// server answers.
func Connect(ctx context.Context, url string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	// Without it pgx encodes a uuid.UUID through its driver.Valuer, as text
	// it then parses back: a tenth of the CPU of a set-based batch, whose
	// statements take arrays of ids.
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := ping(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping %s@%s/%s: %w", cfg.ConnConfig.User, hosts(cfg.ConnConfig.Config), cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// hosts lists the servers cfg tries, in order: a multi-host URL
// (host=a,b, as a highly available database is reached) names several, and
// an error naming only the first would send an operator to the wrong one.
func hosts(cfg pgconn.Config) string {
	list := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, fb := range cfg.Fallbacks {
		// sslmode=prefer adds a fallback without TLS per host.
		if h := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))); !slices.Contains(list, h) {
			list = append(list, h)
		}
	}
	return strings.Join(list, ",")
}

// startupPings is how many times Connect pings a server that does not
// answer within the pool's acquire timeout (WithTimeouts).
const startupPings = 10

// ping checks that the server answers. The acquire timeout bounds a
// request's wait for a connection, and so each ping's, but a first
// connection may take longer on a loaded machine: the pool goes on opening
// it, and a timed-out ping is tried again, up to startupPings times, while
// ctx lasts. Any other error is final.
func ping(ctx context.Context, pool *pgxpool.Pool) error {
	var err error
	for range startupPings {
		if err = pool.Ping(ctx); err == nil || !IsTimeout(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// Migrate applies every pending migration of schema to the database of pool.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema Schema, logger *slog.Logger) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	for _, set := range schema {
		locker, err := lock.NewPostgresSessionLocker()
		if err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
		provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, set.FS,
			goose.WithTableName("goose_"+set.Name+"_version"),
			goose.WithSessionLocker(locker),
			goose.WithDisableGlobalRegistry(true),
		)
		if err != nil {
			return fmt.Errorf("migrations %s: %w", set.Name, err)
		}
		results, err := provider.Up(ctx)
		if err != nil {
			var partial *goose.PartialError
			if errors.As(err, &partial) {
				return fmt.Errorf("migrate %s: %w", set.Name, partial.Err)
			}
			return fmt.Errorf("migrate %s: %w", set.Name, err)
		}
		for _, r := range results {
			logger.InfoContext(ctx, "migration applied", "set", set.Name, "version", r.Source.Version, "duration", r.Duration)
		}
	}
	return nil
}

// MigrateService applies every pending migration of service's schema
// (ServiceSchema) to the database at url, over a pool of its own that it
// closes after them: a migration may run longer than the statement timeout
// of a service's pools.
func MigrateService(ctx context.Context, url, service string, logger *slog.Logger) error {
	schema, err := ServiceSchema(service)
	if err != nil {
		return err
	}
	pool, err := Connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	return Migrate(ctx, pool, schema, logger)
}

// IsLockNotAvailable reports whether err is PostgreSQL's lock_not_available
// (55P03): a lock_timeout ran out, or a NOWAIT lock was held.
func IsLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// IsUniqueViolation reports whether err is PostgreSQL's unique_violation:
// the key a statement inserted was there already.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

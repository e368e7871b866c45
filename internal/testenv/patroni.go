package testenv

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/hapg"
	"github.com/onceflow/onceflow/internal/postgres"
)

// HADatabase is a service database on a highly available PostgreSQL of its
// own: a Patroni cluster of a primary and a standby (package hapg) that
// the test can switch over, kill and hold back.
type HADatabase struct {
	// Name is the database's name on both nodes.
	Name string
	// URL connects to the database on whichever node is the primary.
	URL string
	// Pool is open on URL until the test ends.
	Pool *pgxpool.Pool
	// Cluster is the Patroni cluster, stopped when the test ends.
	Cluster *hapg.Cluster
}

// NewHACluster starts a Patroni cluster for the test, configured by cfg,
// and stops it, with every process it started, when the test ends.
func NewHACluster(t testing.TB, cfg hapg.Config) *hapg.Cluster {
	t.Helper()
	c, err := hapg.Start(t.Context(), cfg, haLogger(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled here.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return c
}

func haLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil)).With("component", "hapg")
}

// NewHADatabase starts a Patroni cluster for the test (NewHACluster) and
// creates a database on it migrated as service's ("" for the platform's
// migrations alone).
func NewHADatabase(t testing.TB, cfg hapg.Config, service string) *HADatabase {
	t.Helper()
	ctx := t.Context()
	c := NewHACluster(t, cfg)
	const name = "service"
	admin, err := postgres.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+ident(name))
	admin.Close()
	if err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	if err := c.AwaitReplay(ctx); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	d := &HADatabase{Name: name, URL: c.URL(name), Cluster: c}
	if err := postgres.MigrateService(ctx, d.URL, service, haLogger(t)); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if d.Pool, err = postgres.Connect(ctx, d.URL); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(d.Pool.Close)
	return d
}

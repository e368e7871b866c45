package dev

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// serverURLs returns how to name a database on the server of databaseURL:
// the same URL with another database; "" keeps databaseURL's own.
func serverURLs(databaseURL string) (func(database string) string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("DATABASE_URL: want a postgres:// URL")
	}
	return func(database string) string {
		if database == "" {
			return databaseURL
		}
		v := *u
		v.Path, v.RawPath = "/"+database, ""
		return v.String()
	}, nil
}

// createDatabases creates each database in names that the server at
// adminURL lacks.
func createDatabases(ctx context.Context, adminURL string, names []string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, name := range names {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
			return fmt.Errorf("look up database %s: %w", name, err)
		}
		if exists {
			continue
		}
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" {
			continue // duplicate_database: created meanwhile, by another dev
		}
		if err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
	}
	return nil
}

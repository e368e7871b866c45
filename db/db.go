// Package db holds the SQL of onceflow: the migrations of every database,
// embedded so that each binary can migrate its own database at start-up, and
// (in db/queries, read by sqlc only) the queries.
//
// Each service database gets the "platform" migrations (inbox, outbox,
// idempotency keys) and then its own set; each set is versioned in its own
// table, so a service adds migrations without coordinating numbers.
package db

import (
	"embed"
	"fmt"
	"io/fs"
)

//go:embed migrations
var migrations embed.FS

// Platform is the name of the migration set every service database gets.
const Platform = "platform"

// Migrations returns the migration files of one set: Platform or a service name.
func Migrations(set string) (fs.FS, error) {
	sub, err := fs.Sub(migrations, "migrations/"+set)
	if err != nil {
		return nil, fmt.Errorf("migration set %q: %w", set, err)
	}
	if _, err := fs.Stat(migrations, "migrations/"+set); err != nil {
		return nil, fmt.Errorf("migration set %q: %w", set, err)
	}
	return sub, nil
}

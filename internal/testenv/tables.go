package testenv

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Tables returns every row of every table q sees, by table, each table's
// rows as their text in order: two calls are equal when nothing q sees
// changed between them (a handler's write outside its transaction, a
// rollback that undid less than all). Rows go as their text, not as
// values: XML, which carries them, has no infinite timestamp
// (partition_floor holds one).
func Tables(ctx context.Context, q Querier) (map[string]string, error) {
	rows, err := q.Query(ctx, `
		SELECT format('%I.%I', table_schema, table_name),
		       query_to_xml(format('SELECT r::text AS row FROM %I.%I AS r ORDER BY r::text', table_schema, table_name), true, false, '')::text
		FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		return nil, fmt.Errorf("read the tables: %w", err)
	}
	all := map[string]string{}
	var name, content string
	if _, err := pgx.ForEachRow(rows, []any{&name, &content}, func() error {
		all[name] = content
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the tables: %w", err)
	}
	return all, nil
}

package testenv

import (
	"context"
	"encoding/json"
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
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
		  AND table_schema NOT LIKE 'pg\_temp\_%'`) // another session's temporary tables cannot be read
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

// Rows returns every row of every table q sees, by table, each row a JSON
// object of its columns: for a comparison column by column, where Tables
// compares whole rows. A partitioned table is read through its parent, and
// temporary tables (one session's scratch) are left out.
func Rows(ctx context.Context, q Querier) (map[string][]map[string]json.RawMessage, error) {
	rows, err := q.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence <> 't'
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')`)
	if err != nil {
		return nil, fmt.Errorf("list the tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the tables: %w", err)
	}
	all := map[string][]map[string]json.RawMessage{}
	for _, name := range names {
		// The name is the server's own, quoted by format.
		rows, err := q.Query(ctx, `SELECT to_jsonb(r)::text FROM `+name+` AS r`)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		for _, text := range texts {
			var row map[string]json.RawMessage
			if err := json.Unmarshal([]byte(text), &row); err != nil {
				return nil, fmt.Errorf("read %s: %w", name, err)
			}
			all[name] = append(all[name], row)
		}
		if all[name] == nil {
			all[name] = []map[string]json.RawMessage{}
		}
	}
	return all, nil
}

package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// run runs the command line args and returns its stdout, stderr and error.
func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = Run(t.Context(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestNoCommandPrintsUsage(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := run(t)
	require.EqualError(t, err, "no command given")
	require.Empty(t, stdout)
	for _, c := range commands() {
		require.Contains(t, stderr, "\n  "+c.name+" ")
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		stdout, stderr, err := run(t, args...)
		require.NoError(t, err, args)
		require.Contains(t, stdout, "Commands:")
		require.Empty(t, stderr)
	}
}

func TestCommandHelp(t *testing.T) {
	t.Parallel()
	tests := map[string][]string{
		"dev":         {"Usage: onceflow dev [--seed]", "-data-dir DIR", "-durable", "-http-port", "-nats-port", "DATABASE_URL"},
		"order":       {"Usage: onceflow order\n", "DATABASE_URL             (required)", "NATS_URL                 default nats://127.0.0.1:4222", "LOG_FORMAT"},
		"notify":      {"SMTP_ADDR", "MAIL_FROM"},
		"migrate":     {"Usage: onceflow migrate [service...]", "ORDER_DATABASE_URL"},
		"healthcheck": {"Usage: onceflow healthcheck [--timeout D] URL", "-timeout"},
		"outbox":      {"Usage: onceflow outbox redrive --since"},
		"mail":        {"Usage: onceflow mail retry [--order ID]"},
	}
	for name, want := range tests {
		for _, args := range [][]string{{"help", name}, {name, "-h"}} {
			stdout, _, err := run(t, args...)
			require.NoError(t, err, args)
			for _, w := range want {
				require.Contains(t, stdout, w, args)
			}
		}
	}
	stdout, _, err := run(t, "outbox", "redrive", "-h")
	require.NoError(t, err)
	require.Contains(t, stdout, "-since")
}

func TestBadInvocations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" (see 'onceflow help')`},
		{[]string{"help", "bogus"}, `unknown command "bogus"`},
		{[]string{"dev", "--bogus"}, "dev: flag provided but not defined: -bogus (see 'onceflow help dev')"},
		{[]string{"dev", "extra"}, "dev: takes no arguments"},
		{[]string{"dev", "--http-port", "x"}, `dev: invalid value "x" for flag -http-port`},
		{[]string{"order", "extra"}, "order: takes no arguments"},
		{[]string{"migrate", "shipping"}, `migrate: unknown service "shipping" (want order, payment, inventory, notify)`},
		{[]string{"migrate", "order", "order"}, `migrate: service "order" named twice`},
		{[]string{"outbox"}, "outbox: want 'onceflow outbox redrive --since RFC3339|DURATION'"},
		{[]string{"outbox", "purge"}, "outbox: want 'onceflow outbox redrive"},
		{[]string{"outbox", "redrive"}, "outbox redrive: --since is required"},
		{[]string{"outbox", "redrive", "--since", "yesterday"}, `outbox redrive: --since "yesterday": want an RFC 3339 time or a positive duration`},
		{[]string{"outbox", "redrive", "--since", "-5m"}, "want an RFC 3339 time or a positive duration"},
		{[]string{"healthcheck"}, "healthcheck: want exactly one URL"},
		{[]string{"mail"}, "mail: want 'onceflow mail retry [--order ID] [--since RFC3339|DURATION]'"},
		{[]string{"mail", "retry", "--order", "42"}, `mail retry: --order "42": not an order id`},
		{[]string{"mail", "retry", "--since", "soon"}, `mail retry: --since "soon": want an RFC 3339 time or a positive duration`},
	}
	for _, tt := range tests {
		_, _, err := run(t, tt.args...)
		require.ErrorContains(t, err, tt.want, tt.args)
	}
}

func TestParseSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	got, err := parseSince("90m", now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-90*time.Minute), got)
	got, err = parseSince("2026-03-01T08:30:00+01:00", now)
	require.NoError(t, err)
	require.True(t, got.Equal(time.Date(2026, 3, 1, 7, 30, 0, 0, time.UTC)))
	for _, bad := range []string{"", "0s", "-1h", "2026-03-01", "soon"} {
		_, err := parseSince(bad, now)
		require.Error(t, err, bad)
	}
}

func TestHealthcheck(t *testing.T) {
	t.Parallel()
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)

	_, _, err := run(t, "healthcheck", srv.URL+"/readyz")
	require.NoError(t, err)
	_, _, err = run(t, "healthcheck", srv.URL+"/down")
	require.EqualError(t, err, "healthcheck "+srv.URL+"/down: 503 Service Unavailable")
	srv.Close()
	_, _, err = run(t, "healthcheck", "--timeout", "1s", srv.URL+"/readyz")
	require.ErrorContains(t, err, "connection refused")
}

// The tests below set environment variables, so they do not run in parallel.

func TestBadLogFormat(t *testing.T) {
	t.Setenv("LOG_FORMAT", "xml")
	_, _, err := run(t, "help")
	require.EqualError(t, err, `LOG_FORMAT "xml": want text or json`)
}

func TestServiceCommandNeedsDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	require.NoError(t, os.Unsetenv("DATABASE_URL")) // t.Setenv restores it
	_, _, err := run(t, "payment")
	require.ErrorContains(t, err, "DATABASE_URL")
}

func TestMigrateNeedsEachDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var vars []string // ORDER_DATABASE_URL, PAYMENT_DATABASE_URL, …
	for _, name := range serviceNames() {
		vars = append(vars, strings.ToUpper(name)+"_DATABASE_URL")
		t.Setenv(vars[len(vars)-1], "")
	}
	_, _, err := run(t, "migrate")
	require.EqualError(t, err, "migrate: set "+strings.Join(vars, ", "))
	require.True(t, strings.HasPrefix(err.Error(), "migrate: set ORDER_DATABASE_URL, PAYMENT_DATABASE_URL, INVENTORY_DATABASE_URL, NOTIFY_DATABASE_URL"))
	_, _, err = run(t, "migrate", "order")
	require.EqualError(t, err, "migrate: set ORDER_DATABASE_URL or DATABASE_URL")

	// DATABASE_URL serves one service, never several: they must not share
	// a database.
	t.Setenv("DATABASE_URL", "postgres://localhost/x")
	_, _, err = run(t, "migrate", "order", "payment")
	require.EqualError(t, err, "migrate: set ORDER_DATABASE_URL, PAYMENT_DATABASE_URL")
}

func TestMigrate(t *testing.T) {
	ctx := t.Context()
	order := testenv.NewDatabase(t, postgres.Schema{})
	payment := testenv.NewDatabase(t, postgres.Schema{})
	t.Setenv("ORDER_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", order.URL)
	t.Setenv("PAYMENT_DATABASE_URL", payment.URL)

	stdout, _, err := run(t, "migrate", "order")
	require.NoError(t, err)
	require.Equal(t, "order: migrated\n", stdout)
	stdout, _, err = run(t, "migrate", "payment")
	require.NoError(t, err)
	require.Equal(t, "payment: migrated\n", stdout)

	tables := func(db *testenv.Database) []string {
		rows, err := db.Pool.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
		require.NoError(t, err)
		var names []string
		for rows.Next() {
			var name string
			require.NoError(t, rows.Scan(&name))
			names = append(names, name)
		}
		require.NoError(t, rows.Err())
		return names
	}
	require.Contains(t, tables(order), "orders")
	require.Contains(t, tables(order), "outbox")
	require.NotContains(t, tables(order), "wallets")
	require.Contains(t, tables(payment), "wallets")

	// Migrating again changes nothing.
	before := tables(order)
	_, _, err = run(t, "migrate", "order")
	require.NoError(t, err)
	require.Equal(t, before, tables(order))
}

func TestOutboxRedrive(t *testing.T) {
	db := testenv.NewServiceDatabase(t, "")
	t.Setenv("DATABASE_URL", db.URL)

	stdout, _, err := run(t, "outbox", "redrive", "--since", "1h")
	require.NoError(t, err)
	require.Contains(t, stdout, "0 outbox rows sent since ")

	t.Setenv("DATABASE_URL", "")
	_, _, err = run(t, "outbox", "redrive", "--since", "1h")
	require.ErrorContains(t, err, "DATABASE_URL")
}

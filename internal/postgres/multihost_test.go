package postgres_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

// A multi-host URL, as a highly available database is reached: Connect
// goes past a server that is down to the one that accepts writes, and the
// pool opens new sessions there once its sessions are broken.
func TestConnectTakesTheFirstHostThatAcceptsWrites(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.NewDatabase(t, postgres.Schema{})
	down := testenv.FreePorts(t, 1)[0] // nothing listens there
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	multi := fmt.Sprintf("postgres://%s@127.0.0.1:%d,%s%s?sslmode=disable&target_session_attrs=read-write",
		u.User.String(), down, u.Host, u.Path)

	pool, err := postgres.Connect(ctx, multi)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE t (v int)`)
	require.NoError(t, err)

	require.NoError(t, db.TerminateBackends(ctx))
	// The first statement on a broken session fails; the pool drops it and
	// the next one connects again.
	_, _ = pool.Exec(ctx, `INSERT INTO t VALUES (1)`)
	_, err = pool.Exec(ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, err)
}

// When no host answers, the error names every host tried, not the first.
func TestConnectNamesEveryHostItTried(t *testing.T) {
	t.Parallel()
	ports := testenv.FreePorts(t, 2)
	_, err := postgres.Connect(t.Context(), fmt.Sprintf(
		"postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/db?sslmode=disable&connect_timeout=2", ports[0], ports[1]))
	require.ErrorContains(t, err, fmt.Sprintf("ping postgres@127.0.0.1:%d,127.0.0.1:%d/db:", ports[0], ports[1]))
}

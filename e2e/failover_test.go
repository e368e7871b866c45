package e2e

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/hapg"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestDatabaseFailover runs the saga's four databases on a Patroni cluster
// of their own, a primary and a synchronous standby, which the services
// reach through a multi-host URL (target_session_attrs=read-write). During
// the load it switches over, as `patronictl switchover` does, and then
// kills the new primary's node (Patroni and postmaster, SIGKILL), so that
// the standby is promoted. Nothing may be lost, published without being
// held, or stored twice.
func TestDatabaseFailover(t *testing.T) {
	t.Parallel()
	pg, cluster := startHAPostgres(t, hapg.Config{MaxConnections: 400})
	sys := newSystemOn(t, pg, startOneNATS)
	d := startDriver(t, sys, deployment{}, scaled(300))
	err := d.run(t.Context(), func(ctx context.Context) error {
		if err := d.awaitOrders(ctx, 80); err != nil {
			return err
		}
		if _, err := cluster.Switchover(ctx); err != nil {
			return err
		}
		sys.faults.add("postgres_switchover", 1)
		if err := d.awaitOrders(ctx, 180); err != nil {
			return err
		}
		if _, err := cluster.KillPrimary(ctx); err != nil {
			return err
		}
		sys.faults.add("postgres_kill_9_primary_node", 1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.waitQuiet(2 * time.Minute); err != nil {
		t.Errorf("e2e: %v", err)
	}
	sys.verify(d, expect{})
	sys.checkStoredOnce()
}

// startHAPostgres starts a Patroni cluster for the test and returns it as
// the scenario's server, stopped when the test ends.
func startHAPostgres(t *testing.T, cfg hapg.Config) (*pgServer, *hapg.Cluster) {
	t.Helper()
	cluster := testenv.NewHACluster(t, cfg)
	adminURL := cluster.URL("postgres")
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	admin, err := pgxpool.New(t.Context(), adminURL)
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	t.Cleanup(admin.Close)
	return &pgServer{
		source:     "patroni cluster",
		adminURL:   u,
		admin:      admin,
		stopFn:     func(context.Context) error { return nil }, // NewHACluster's clean-up
		replicated: cluster.AwaitReplay,
	}, cluster
}

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/natsauth"
)

// TestDatabaseCrash kills the PostgreSQL postmaster with SIGKILL three
// times during the load and starts it again on the same data directory,
// which replays the WAL (crash recovery; TestDatabaseRestart's is a clean
// shutdown). Around each crash every service's link to NATS gets 150ms of
// latency, so that the relays have claimed rows published and not yet
// marked sent when the database goes: those are published again after the
// recovery, and the broker's duplicate window must drop them. The
// transactions open at each crash (HTTP writes, inbox batches, relay marks:
// commits in flight) are counted just before the kill. Nothing may be lost
// or stored twice. On a server the suite cannot crash (TEST_DATABASE_URL,
// a container) every backend is terminated instead, which the figures say.
// Like TestDatabaseRestart it does not run in parallel with the others:
// the server is theirs too.
func TestDatabaseCrash(t *testing.T) {
	sys := newSystem(t)
	px := newToxics()
	natsLinks := map[string]*toxicProxy{}
	natsAddr := map[string]string{}
	for _, kind := range kinds {
		natsLinks[kind] = px.proxy(t, kind+"-nats", sys.nats.addr())
		natsAddr[kind] = natsLinks[kind].addr()
	}
	d := startDriver(t, sys, deployment{natsAddr: natsAddr}, scaled(400))
	watch := newPublishWatch(t, []string{sys.natsURL}, sys.natsClient(natsauth.Admin).Options(natsauth.Admin)...)
	slow := toxic{"latency", "downstream", 1, `{"latency":150,"jitter":50}`}

	var openAtCrash int64
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 3 {
			if err := d.awaitOrders(ctx, 80+120*i); err != nil {
				return err
			}
			g, gctx := errgroup.WithContext(ctx)
			for _, p := range natsLinks {
				g.Go(func() error { return p.apply(gctx, slow, 3*time.Second) })
			}
			sleepCtx(ctx, time.Second)
			open, err := sys.openTransactions(ctx)
			if err != nil {
				return err
			}
			how, err := sys.pg.outage(ctx, sys.databases(), true)
			if err != nil {
				return err
			}
			openAtCrash += open
			sys.faults.add("postgres_"+how, 1)
			if err := g.Wait(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.waitQuiet(2 * time.Minute); err != nil {
		t.Errorf("e2e: %v", err)
	}
	republished := watch.republished()
	sys.observed.add("transactions_open_at_crash", openAtCrash)
	sys.observed.add("events_republished_after_crash", int64(republished))
	sys.verify(d, expect{})
	if openAtCrash == 0 {
		t.Errorf("e2e: no transaction was open at any of the crashes")
	}
	if republished == 0 {
		t.Errorf("e2e: no event was published again after a crash: no relay had claimed rows in flight when the database went")
	}
	sys.checkStoredOnce()
}

// openTransactions counts the sessions of the scenario's databases that are
// in a transaction.
func (sys *system) openTransactions(ctx context.Context) (int64, error) {
	var n int64
	err := sys.pg.admin.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = ANY($1) AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`,
		sys.databases()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count open transactions: %w", err)
	}
	return n, nil
}

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/natsauth"
)

// TestDatabaseCrash kills the PostgreSQL postmaster with SIGKILL three
// times during the load and starts it again on the same data directory,
// which replays the WAL (crash recovery; TestDatabaseRestart's is a clean
// shutdown). Nothing may be lost or stored twice. On a server the suite
// cannot crash (TEST_DATABASE_URL, a container) every backend is
// terminated instead, which the figures say. Like TestDatabaseRestart it
// does not run in parallel with the others: the server is theirs too.
//
// What each crash must meet is arranged, not hoped for (see holdForCrash):
// before each kill the test holds row locks that the services' next writes
// need, and kills only once a relay's mark of rows it has published and a
// handler's write (payment's debit, inside its inbox transaction) wait
// behind them. So at every crash a service transaction is open, and a
// relay has rows published and not marked sent, which it publishes again
// after the recovery: the broker's duplicate window must drop them.
func TestDatabaseCrash(t *testing.T) {
	sys := newSystem(t)
	d := startDriver(t, sys, deployment{}, scaled(400))
	watch := newPublishWatch(t, []string{sys.natsURL}, sys.natsClient(natsauth.Admin).Options(natsauth.Admin)...)

	var openAtCrash int64
	err := d.run(t.Context(), func(ctx context.Context) error {
		for i := range 3 {
			if err := d.awaitOrders(ctx, 80+120*i); err != nil {
				return err
			}
			h, err := sys.holdForCrash(ctx)
			if err != nil {
				return err
			}
			open, err := h.await(ctx, 2*time.Minute)
			if err == nil {
				var how string
				how, err = sys.pg.outage(ctx, sys.databases(), true)
				sys.faults.add("postgres_"+how, 1)
			}
			h.release(ctx)
			if err != nil {
				return err
			}
			openAtCrash += open
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
	if republished == 0 {
		t.Errorf("e2e: no event was published again after a crash, though a relay's mark of published rows was held at each")
	}
	sys.checkStoredOnce()
}

// crashHold is a transaction per service database that holds locks the
// service's next writes need: outbox_batch (the relay claims without
// locking, publishes, and then waits to record its position) and, in
// payment's, every wallet (the next debit waits inside its inbox
// transaction).
type crashHold struct {
	sys *system
	txs map[string]pgx.Tx // by kind
	// pids are the sessions of txs, whose waiters are the held ones.
	pids []int32
}

// holdKinds are the services whose outbox the hold takes: those that
// publish saga events.
var holdKinds = []string{"order", "payment", "inventory"}

// holdForCrash begins the hold's transactions.
func (sys *system) holdForCrash(ctx context.Context) (*crashHold, error) {
	h := &crashHold{sys: sys, txs: map[string]pgx.Tx{}}
	for _, kind := range holdKinds {
		tx, err := sys.pools[kind].Begin(ctx)
		if err != nil {
			h.release(ctx)
			return nil, fmt.Errorf("hold %s: %w", kind, err)
		}
		h.txs[kind] = tx
		var pid int32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			h.release(ctx)
			return nil, fmt.Errorf("hold %s: %w", kind, err)
		}
		h.pids = append(h.pids, pid)
	}
	return h, nil
}

// lock takes outbox_batch, so that the relays' next records (inserts)
// wait, and the wallets written since the last call. SHARE: the relays'
// claims read outbox_batch all the same, and publish; the lock waits only
// for a record in progress, whose transaction takes no other lock the hold
// has.
// SKIP LOCKED: a wallet a service is writing is left to it, so the hold
// never waits for a service there (and never deadlocks with one); it takes
// it on a later call.
func (h *crashHold) lock(ctx context.Context) error {
	for kind, tx := range h.txs {
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_batch IN SHARE MODE`); err != nil {
			return fmt.Errorf("hold %s outbox: %w", kind, err)
		}
		if kind == "payment" {
			if _, err := tx.Exec(ctx, `SELECT customer_id FROM wallets FOR UPDATE SKIP LOCKED`); err != nil {
				return fmt.Errorf("hold wallets: %w", err)
			}
		}
	}
	return nil
}

// held counts the service sessions waiting for the hold's locks: relays
// recording their positions, and the other writes (handlers; not the
// partition maintenance, whose pruning waits for outbox_batch too). A wait counts only
// when its statement began less than 5s ago, so that the services'
// statement timeout (10s) cannot end it before the crash that follows.
func (h *crashHold) held(ctx context.Context) (relays, writes int64, err error) {
	err = h.sys.pg.admin.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE query LIKE '%INSERT INTO outbox_batch%'),
		       count(*) FILTER (WHERE query NOT LIKE '%outbox_batch%' AND query NOT LIKE '%partition\_%')
		FROM pg_stat_activity
		WHERE datname = ANY($1) AND pg_blocking_pids(pid) && $2::int[]
		  AND query_start > now() - interval '5 seconds'`,
		h.sys.databases(), h.pids).Scan(&relays, &writes)
	if err != nil {
		return 0, 0, fmt.Errorf("count held sessions: %w", err)
	}
	return relays, writes, nil
}

// await takes the locks, again and again, until a relay's mark and another
// write wait for them, and returns the service transactions open then.
func (h *crashHold) await(ctx context.Context, timeout time.Duration) (open int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if err := h.lock(ctx); err != nil {
			return 0, err
		}
		relays, writes, err := h.held(ctx)
		if err != nil {
			return 0, err
		}
		if relays > 0 && writes > 0 {
			h.sys.observed.add("relay_marks_held_at_crash", relays)
			h.sys.observed.add("writes_held_at_crash", writes)
			return h.sys.openTransactions(ctx, h.pids)
		}
		// A row is unsent for as long as its relay takes to publish it:
		// the next rows are taken at once.
		if !sleepCtx(ctx, time.Millisecond) {
			return 0, fmt.Errorf("no relay mark and write waiting for the crash hold (%d and %d): %w", relays, writes, ctx.Err())
		}
	}
}

// release ends the hold: after a crash its sessions are gone, and the
// rollback only hands the broken connections back.
func (h *crashHold) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, tx := range h.txs {
		_ = tx.Rollback(ctx)
	}
}

// openTransactions counts the sessions of the scenario's databases that are
// in a transaction, but for the harness's own (not).
func (sys *system) openTransactions(ctx context.Context, not []int32) (int64, error) {
	var n int64
	err := sys.pg.admin.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = ANY($1) AND xact_start IS NOT NULL
		  AND pid <> pg_backend_pid() AND pid <> ALL($2::int[])`,
		sys.databases(), not).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count open transactions: %w", err)
	}
	return n, nil
}

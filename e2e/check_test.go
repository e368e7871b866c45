package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/streams"
)

// expect is what a scenario's fault legitimately leaves behind.
type expect struct {
	// dlq is the number of DLQ entries the scenario caused on purpose.
	dlq int64
	// exactCounts holds when no process died and no commit was ambiguous:
	// then each consumer's "processed" counter equals its inbox rows, not
	// only bounds them.
	exactCounts bool
	// minDuplicates is the least number of duplicates the inboxes must have
	// dropped: the copies the scenario made.
	minDuplicates int64
}

// verify waits until the system is quiet, runs the auditor and the client's
// own checks, logs the scenario's figures line and fails on any violation.
func (sys *system) verify(d *driver, e expect) {
	t := sys.t
	t.Helper()
	quietStart := time.Now()
	// A system that does not go quiet is audited all the same: the report
	// says what is stuck.
	auditWait := time.Minute
	if err := sys.waitQuiet(2 * time.Minute); err != nil {
		t.Errorf("e2e: %v", err)
		auditWait = 0
	}
	quiet := time.Since(quietStart)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, s := range sys.services {
		s.scrape(ctx)
	}

	report, err := audit.Run(ctx, audit.Config{
		OrderURL:     sys.pg.url(sys.dbName("order")),
		PaymentURL:   sys.pg.url(sys.dbName("payment")),
		InventoryURL: sys.pg.url(sys.dbName("inventory")),
		NotifyURL:    sys.pg.url(sys.dbName("notify")),
		NATSURL:      sys.natsURL,
		NATSCreds:    sys.creds[streams.Operator],
		Wait:         auditWait,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("e2e: audit: %v", err)
	}
	var printed strings.Builder
	_ = report.Print(&printed)
	if !report.OK() {
		t.Errorf("e2e: the auditor found %d violations:\n%s", report.Violations(), printed.String())
	}

	oracle, outcomes := sys.oracle(ctx, d, e)
	for _, v := range oracle {
		t.Errorf("e2e: %s", v)
	}

	f := sys.figures(ctx, d, report, outcomes)
	f.violations = report.Violations() + len(oracle)
	f.load, f.quiet = d.loadTime, quiet
	t.Logf("figures: %s", f)

	if f.dlq != e.dlq {
		t.Errorf("e2e: %d DLQ entries, want %d", f.dlq, e.dlq)
	}
	if f.duplicates < e.minDuplicates {
		t.Errorf("e2e: the inboxes dropped %d duplicates, want at least %d", f.duplicates, e.minDuplicates)
	}
}

// figures are the numbers of a scenario's one-line summary.
type figures struct {
	scenario                 string
	orders                   int
	outcomes                 map[string]int
	duplicates, redeliveries int64
	faults                   int64
	faultKinds               string
	observed                 string
	dlq                      int64
	violations               int
	httpRetries, replays     int64
	processed, inboxRows     int64
	naks                     int64
	load, quiet, elapsed     time.Duration
}

func (f figures) String() string {
	return fmt.Sprintf("scenario=%s orders=%d (confirmed=%d rejected=%d cancelled=%d expired=%d) duplicates_dropped=%d redeliveries=%d "+
		"faults=%d (%s) observed=(%s) dlq=%d violations=%d http_retries=%d http_replays=%d processed=%d inbox_rows=%d naks=%d load=%s quiet=%s elapsed=%s",
		f.scenario, f.orders, f.outcomes["CONFIRMED"], f.outcomes["REJECTED"], f.outcomes["CANCELLED"], f.outcomes["EXPIRED"],
		f.duplicates, f.redeliveries, f.faults, f.faultKinds, f.observed, f.dlq, f.violations, f.httpRetries, f.replays,
		f.processed, f.inboxRows, f.naks, f.load.Round(100*time.Millisecond), f.quiet.Round(100*time.Millisecond), f.elapsed.Round(100*time.Millisecond))
}

func (sys *system) figures(ctx context.Context, d *driver, report audit.Report, outcomes map[string]int) figures {
	faults := sys.faults.snapshot()
	for _, s := range sys.services {
		s.mu.Lock()
		if s.selfKills > 0 {
			faults["self_kill_after_commit:"+s.name] += int64(s.selfKills)
		}
		s.mu.Unlock()
	}
	var total int64
	parts := make([]string, 0, len(faults))
	for _, k := range slices.Sorted(maps.Keys(faults)) {
		total += faults[k]
		parts = append(parts, fmt.Sprintf("%s=%d", k, faults[k]))
	}
	observed := sys.observed.snapshot()
	seen := make([]string, 0, len(observed))
	for _, k := range slices.Sorted(maps.Keys(observed)) {
		seen = append(seen, fmt.Sprintf("%s=%d", k, observed[k]))
	}
	m := sys.counters()
	f := figures{
		observed:    strings.Join(seen, " "),
		scenario:    sys.t.Name(),
		orders:      len(d.placedOrders()),
		outcomes:    outcomes,
		duplicates:  m.total("duplicate"),
		processed:   m.total("processed"),
		naks:        m.total("retried"),
		faults:      total,
		faultKinds:  strings.Join(parts, " "),
		httpRetries: d.c.retries.Load(),
		replays:     d.replays.Load(),
		elapsed:     time.Since(sys.began),
	}
	var err error
	if f.redeliveries, err = sys.redeliveries(ctx); err != nil {
		sys.t.Errorf("e2e: redeliveries: %v", err)
	}
	if c, ok := report.Find(audit.CheckConsumers); ok {
		if perDurable, ok := c.Figure("dlq entries").(map[string]int64); ok {
			for _, n := range perDurable {
				f.dlq += n
			}
		}
	}
	for _, pool := range sys.pools {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_events`).Scan(&n); err == nil {
			f.inboxRows += n
		}
	}
	return f
}

// oracle checks what only the client knows — what it asked for — against
// the databases, and returns the violations and the orders' outcomes:
//   - one order per Idempotency-Key, and no order the client did not place;
//   - every order terminal, with the payment, reservation and e-mails its
//     status implies;
//   - each credit the API accepted applied once: credits recorded = credits
//     sent, and balance + debited (not refunded) = credits, per customer;
//   - stock as received: available + reserved = what the client's receipts
//     brought, per SKU;
//   - each event's handler committed once per consumer: the "processed"
//     counters never exceed the inbox rows (and equal them when no process
//     died and no commit was ambiguous).
func (sys *system) oracle(ctx context.Context, d *driver, e expect) (violations []string, outcomes map[string]int) {
	fail := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	placed := d.placedOrders()
	outcomes = map[string]int{}

	status := map[uuid.UUID]string{}
	rows, err := sys.pools["order"].Query(ctx, `SELECT id, status FROM orders`)
	if err == nil {
		for rows.Next() {
			var id uuid.UUID
			var s string
			if err = rows.Scan(&id, &s); err != nil {
				break
			}
			status[id] = s
			outcomes[s]++
		}
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		fail("read orders: %v", err)
		return violations, outcomes
	}
	if len(status) != len(placed) {
		fail("%d orders in the database for %d Idempotency-Keys placed", len(status), len(placed))
	}
	for key, id := range placed {
		if _, ok := status[id]; !ok {
			fail("order %s (key %s) was answered 201 but is not in the database", id, key)
		}
	}

	type payment struct {
		status string
		amount int64
	}
	payments := map[uuid.UUID]payment{}
	debited := map[string]int64{}
	if err := scanRows(ctx, sys, "payment", `SELECT order_id, customer_id, status, amount_cents FROM payments`, func(scan func(...any) error) error {
		var id uuid.UUID
		var customer string
		var p payment
		if err := scan(&id, &customer, &p.status, &p.amount); err != nil {
			return err
		}
		payments[id] = p
		if p.status == "DEBITED" {
			debited[customer] += p.amount
		}
		return nil
	}); err != nil {
		fail("read payments: %v", err)
	}
	reservations, err := sys.reservations(ctx)
	if err != nil {
		fail("read reservations: %v", err)
	}
	mails := map[uuid.UUID][]string{}
	if err := scanRows(ctx, sys, "notify", `SELECT order_id, kind, status FROM notifications`, func(scan func(...any) error) error {
		var id uuid.UUID
		var kind, s string
		if err := scan(&id, &kind, &s); err != nil {
			return err
		}
		if s != "SENT" {
			fail("e-mail %s of order %s is %s", kind, id, s)
		}
		mails[id] = append(mails[id], kind)
		return nil
	}); err != nil {
		fail("read notifications: %v", err)
	}
	for id, s := range status {
		p, r := payments[id], reservations[id]
		var milestone string
		switch s {
		case "CONFIRMED":
			milestone = "confirmed"
			if p.status != "DEBITED" || r != "RESERVED" {
				fail("order %s is CONFIRMED with payment %q and reservation %q", id, p.status, r)
			}
		case "REJECTED":
			milestone = "rejected"
			if p.status != "REJECTED" || r != "" {
				fail("order %s is REJECTED with payment %q and reservation %q", id, p.status, r)
			}
		case "CANCELLED":
			milestone = "cancelled"
			if p.status != "REFUNDED" || r != "REJECTED" {
				fail("order %s is CANCELLED with payment %q and reservation %q", id, p.status, r)
			}
		case "EXPIRED":
			// Whatever was done for it is undone: no money kept, no stock
			// held (docs/saga.md).
			milestone = "expired"
			if !slices.Contains([]string{"", "EXPIRED", "REJECTED", "REFUNDED"}, p.status) ||
				!slices.Contains([]string{"", "EXPIRED", "REJECTED", "RELEASED"}, r) {
				fail("order %s is EXPIRED with payment %q and reservation %q", id, p.status, r)
			}
		default:
			fail("order %s is %s, not settled", id, s)
			continue
		}
		got := strings.Join(sortedCopy(mails[id]), ",")
		if want := strings.Join(sortedCopy([]string{"placed", milestone}), ","); got != want {
			fail("order %s (%s) has e-mails [%s], want [%s]", id, s, got, want)
		}
	}

	d.mu.Lock()
	credited, creditCount, stock := d.credited, d.credits, d.stock
	d.mu.Unlock()
	recorded, recordedCount := map[string]int64{}, map[string]int{}
	if err := scanRows(ctx, sys, "payment", `SELECT customer_id, sum(amount_cents)::bigint, count(*) FROM wallet_credits GROUP BY customer_id`, func(scan func(...any) error) error {
		var c string
		var sum int64
		var n int
		if err := scan(&c, &sum, &n); err != nil {
			return err
		}
		recorded[c], recordedCount[c] = sum, n
		return nil
	}); err != nil {
		fail("read credits: %v", err)
	}
	balances := map[string]int64{}
	if err := scanRows(ctx, sys, "payment", `SELECT customer_id, balance_cents FROM wallets`, func(scan func(...any) error) error {
		var c string
		var b int64
		if err := scan(&c, &b); err != nil {
			return err
		}
		balances[c] = b
		return nil
	}); err != nil {
		fail("read wallets: %v", err)
	}
	for _, c := range d.w.customers {
		if recorded[c.id] != credited[c.id] || recordedCount[c.id] != creditCount[c.id] {
			fail("wallet %s: %d credits of %d cents recorded, the client had %d accepted, of %d cents",
				c.id, recordedCount[c.id], recorded[c.id], creditCount[c.id], credited[c.id])
		}
		if got := balances[c.id] + debited[c.id]; got != credited[c.id] {
			fail("wallet %s: balance %d + debited %d = %d, but %d was credited", c.id, balances[c.id], debited[c.id], got, credited[c.id])
		}
	}

	available, reserved := map[string]int64{}, map[string]int64{}
	if err := scanRows(ctx, sys, "inventory", `SELECT sku, available FROM stock`, func(scan func(...any) error) error {
		var sku string
		var n int64
		if err := scan(&sku, &n); err != nil {
			return err
		}
		available[sku] = n
		return nil
	}); err != nil {
		fail("read stock: %v", err)
	}
	// A released reservation keeps its lines as the record of what it held;
	// its units are available again.
	if err := scanRows(ctx, sys, "inventory", `SELECT l.sku, sum(l.quantity)::bigint FROM reservation_lines l
		JOIN reservations r USING (order_id) WHERE r.status <> 'RELEASED' GROUP BY l.sku`, func(scan func(...any) error) error {
		var sku string
		var n int64
		if err := scan(&sku, &n); err != nil {
			return err
		}
		reserved[sku] = n
		return nil
	}); err != nil {
		fail("read reservation lines: %v", err)
	}
	for sku, level := range stock {
		if got := available[sku] + reserved[sku]; got != level {
			fail("sku %s: available %d + reserved %d = %d, but it received %d", sku, available[sku], reserved[sku], got, level)
		}
	}
	if n := reserved[d.w.unknownSKU] + available[d.w.unknownSKU]; n != 0 {
		fail("the unknown sku %s has stock or reservations: %d", d.w.unknownSKU, n)
	}

	violations = append(violations, sys.inboxViolations(ctx, e.exactCounts)...)
	return violations, outcomes
}

// inboxViolations compares each consumer's "processed" counter, summed over
// its instances and incarnations, with its inbox rows. An event's handler
// commits at most once per consumer, so the counter can never exceed the
// rows: if it does, the inbox let a duplicate through. Counts of killed
// incarnations are partly lost, and a commit that failed on the client may
// have happened on the server, so only without either must they be equal.
func (sys *system) inboxViolations(ctx context.Context, exact bool) []string {
	var violations []string
	m := sys.counters()
	for _, c := range streams.Saga(streams.Config{}).Consumers {
		kind := strings.SplitN(c.Durable, "-", 2)[0]
		var rows int64
		if err := sys.pools[kind].QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE consumer = $1`, c.Durable).Scan(&rows); err != nil {
			violations = append(violations, fmt.Sprintf("read inbox of %s: %v", c.Durable, err))
			continue
		}
		processed := int64(m[metricKey{c.Durable, "processed"}])
		switch {
		case processed > rows:
			violations = append(violations, fmt.Sprintf("consumer %s committed %d handler runs for %d events: the inbox let duplicates through", c.Durable, processed, rows))
		case exact && processed != rows:
			violations = append(violations, fmt.Sprintf("consumer %s counted %d events processed, its inbox holds %d", c.Durable, processed, rows))
		}
	}
	return violations
}

// reservations are inventory's decisions, by order.
func (sys *system) reservations(ctx context.Context) (map[uuid.UUID]string, error) {
	reservations := map[uuid.UUID]string{}
	err := scanRows(ctx, sys, "inventory", `SELECT order_id, status FROM reservations`, func(scan func(...any) error) error {
		var id uuid.UUID
		var s string
		if err := scan(&id, &s); err != nil {
			return err
		}
		reservations[id] = s
		return nil
	})
	return reservations, err
}

// scanRows runs query on kind's database and calls each for every row.
func scanRows(ctx context.Context, sys *system, kind, query string, each func(scan func(...any) error) error) error {
	rows, err := sys.pools[kind].Query(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func sortedCopy(s []string) []string { return slices.Sorted(slices.Values(s)) }

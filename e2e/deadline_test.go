package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// orderDeadline is the deadline TestDeadlines gives its orders: short, so
// that hundreds of them pass it while the load runs.
const orderDeadline = 5 * time.Second

// TestDeadlines stalls a participant past the deadline under load, and
// restarts the order service while deadlines pass (docs/saga.md):
//
//  1. The operator pauses inventory's two durables (inventory-payments,
//     inventory-expiries) through JetStream's consumer pause, as an
//     operator stalls a durable during an incident. Orders are placed;
//     payment debits them and they wait, PAID, for a reservation that does
//     not come, until the order service expires them and payment refunds.
//     The test waits until every one of them is terminal.
//  2. More orders are placed, and the order service is stopped before
//     their deadlines; it is started again once every open order's
//     deadline has passed (awaited on the database's clock).
//  3. Once every order is terminal, the operator resumes
//     inventory-payments, and inventory-expiries only when the other has
//     caught up: inventory reserves for orders that have expired, so every
//     StockReserved and StockRejected reaches the order service late. Had
//     both resumed at once, an OrderExpired could overtake its
//     PaymentDebited, and inventory would rightly reserve nothing — no late
//     reply. Then inventory-expiries releases what was reserved.
//
// It checks, besides the auditor and the client's oracle: every order
// terminal; every expired order's money and stock back; every late reply on
// its order's timeline with its fate; and that deadlines fire within a
// second at p99 — expired_at minus the deadline, per order, from the
// database; for an order whose deadline came while the order service was
// down (or less than a second before it stopped), from the moment the
// restarted service answered /readyz.
func TestDeadlines(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{
		env: map[string][]string{"order": {"ORDER_DEADLINE=" + orderDeadline.String()}},
	}, scaled(300))
	ctx := t.Context()
	op, err := sys.connectAs(streams.Operator)
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	defer op.close()
	stalled := []struct{ stream, durable string }{
		{streams.Payments, streams.InventoryPayments},
		{streams.Orders, streams.InventoryExpiries},
	}
	for _, c := range stalled {
		resp, err := op.js.PauseConsumer(ctx, c.stream, c.durable, time.Now().Add(time.Hour))
		if err != nil || !resp.Paused {
			t.Fatalf("e2e: pause %s: %v (%+v)", c.durable, err, resp)
		}
		sys.faults.add("paused:"+c.durable, 1)
	}

	if err := d.run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// These orders' deadlines pass while the order service runs.
	if err := sys.awaitNoOpenOrders(ctx, 2*time.Minute); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	down, err := sys.restartOrderPastDeadlines(ctx, d, scaled(200))
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if err := sys.awaitNoOpenOrders(ctx, 2*time.Minute); err != nil {
		t.Fatalf("e2e: %v", err)
	}

	resumed := time.Now()
	for _, c := range stalled {
		if _, err := op.js.ResumeConsumer(ctx, c.stream, c.durable); err != nil {
			t.Fatalf("e2e: resume %s: %v", c.durable, err)
		}
		if err := sys.awaitDrained(ctx, c.stream, c.durable, 2*time.Minute); err != nil {
			t.Fatalf("e2e: %v", err)
		}
	}
	t.Logf("the stalled durables caught up %s after their resumption", time.Since(resumed).Round(time.Millisecond))
	sys.verify(d, expect{})

	lags, err := sys.expiryLags(ctx, down)
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	for _, g := range []struct {
		name string
		lags []time.Duration
	}{{"running", lags.running}, {"restarted", lags.restarted}} {
		p99 := percentile(g.lags, 0.99)
		t.Logf("expiry lag, orders expired by the %s service: n=%d p50=%s p99=%s max=%s", g.name, len(g.lags),
			percentile(g.lags, 0.5), p99, percentile(g.lags, 1))
		if len(g.lags) == 0 || p99 > time.Second {
			t.Errorf("e2e: deadlines of the %s service fired %s late at p99 over %d orders, want within 1s", g.name, p99, len(g.lags))
		}
	}
	t.Logf("expiry lag of the restarted service's orders from its launch (start-up included): p50=%s p99=%s max=%s",
		percentile(lags.sinceLaunch, 0.5), percentile(lags.sinceLaunch, 0.99), percentile(lags.sinceLaunch, 1))
	sys.checkLateReplies(ctx)
}

// downtime is when the order service stopped and when it was ready again.
type downtime struct{ stopped, launched, ready time.Time }

// restartOrderPastDeadlines places up to n more orders, stops the order
// service before their deadlines, waits until every open order's deadline
// has passed and starts it again.
func (sys *system) restartOrderPastDeadlines(ctx context.Context, d *driver, n int) (downtime, error) {
	// No order is placed later than half a deadline from the first: the
	// stop comes before any of their deadlines, however slow the machine.
	// A placement under way is not cut short (its order would exist
	// without the client knowing).
	last := time.Now().Add(orderDeadline / 2)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(d.w.workers)
	for range n {
		g.Go(func() error {
			if time.Now().After(last) {
				return nil
			}
			return d.placeNext(gctx)
		})
	}
	if err := g.Wait(); err != nil {
		return downtime{}, fmt.Errorf("place orders: %w", err)
	}
	var dt downtime
	var err error
	dt.stopped = time.Now()
	dt.launched, dt.ready, err = sys.instances("order")[0].restartAfter(ctx, func(ctx context.Context) error {
		var open int
		if err := sys.pools["order"].QueryRow(ctx, `SELECT count(*) FROM orders WHERE status IN ('PENDING', 'PAID') AND deadline > $1`, dt.stopped).Scan(&open); err != nil {
			return fmt.Errorf("open orders: %w", err)
		}
		// The precondition of the restart's half of the scenario: orders
		// whose deadline comes while the service is down.
		if want := min(n/4, 25); open < want {
			return fmt.Errorf("%d orders open with a deadline after the order service stopped, want at least %d", open, want)
		}
		sys.observed.add("deadlines_while_order_down", int64(open))
		return sys.awaitQuery(ctx, time.Minute, `SELECT count(*) FROM orders WHERE status IN ('PENDING', 'PAID') AND deadline >= now()`)
	})
	if err != nil {
		return downtime{}, err
	}
	sys.faults.add("order_stopped_past_deadlines", 1)
	return dt, nil
}

// awaitNoOpenOrders waits until every order is terminal.
func (sys *system) awaitNoOpenOrders(ctx context.Context, timeout time.Duration) error {
	return sys.awaitQuery(ctx, timeout, `SELECT count(*) FROM orders WHERE status IN ('PENDING', 'PAID')`)
}

// awaitQuery waits until count, a query of the order database, is 0.
func (sys *system) awaitQuery(ctx context.Context, timeout time.Duration, count string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var n int
		if err := sys.pools["order"].QueryRow(ctx, count).Scan(&n); err != nil {
			return fmt.Errorf("%s: %w", count, err)
		}
		if n == 0 {
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%s: still %d after %s", count, n, timeout)
		}
	}
}

// awaitDrained waits until durable has nothing pending or unacknowledged.
func (sys *system) awaitDrained(ctx context.Context, stream, durable string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		info, err := sys.consumerInfo(ctx, stream, durable)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && !info.Paused {
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%s did not catch up within %s: %+v, %v", durable, timeout, info, err)
		}
	}
}

// expiryLags are how late each expired order was expired: after its
// deadline, or, for an order the restarted service expired whose deadline
// came while the order service was down or less than a second before it
// stopped, after the service was ready again.
type expiryLags struct {
	running, restarted []time.Duration
	// sinceLaunch are the restarted group's lags from the moment the
	// service was launched again, start-up included: logged, not held to
	// the second (a loaded machine's start-up alone may take that).
	sinceLaunch []time.Duration
}

func (sys *system) expiryLags(ctx context.Context, down downtime) (expiryLags, error) {
	var l expiryLags
	query := fmt.Sprintf(`SELECT o.deadline, t.at FROM orders o JOIN order_timeline t ON t.order_id = o.id
		WHERE o.status = 'EXPIRED' AND t.event_type = '%s'`, event.OrderExpired)
	err := scanRows(ctx, sys, "order", query, func(scan func(...any) error) error {
		var deadline, expired time.Time
		if err := scan(&deadline, &expired); err != nil {
			return err
		}
		switch {
		case expired.Before(down.stopped):
			l.running = append(l.running, expired.Sub(deadline))
		case deadline.After(down.stopped.Add(-time.Second)):
			// Expired by the restarted service (or as it stopped, which
			// counts as no lag).
			l.restarted = append(l.restarted, max(0, expired.Sub(down.ready)))
			l.sinceLaunch = append(l.sinceLaunch, expired.Sub(down.launched))
		default:
			// Due over a second before the stop, and the running service
			// had not expired it: its lag counts from its deadline.
			l.running = append(l.running, expired.Sub(deadline))
		}
		return nil
	})
	return l, err
}

// percentile is the p-quantile of ds (nearest rank), 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := int(float64(len(s))*p+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// checkLateReplies checks that the stalled participant's replies reached
// their expired orders and are on the timeline with their fate: a
// StockReserved as "released" (and inventory released it), a StockRejected
// as "unchanged"; and that there were hundreds of them.
func (sys *system) checkLateReplies(ctx context.Context) {
	t := sys.t
	reservations, err := sys.reservations(ctx)
	if err != nil {
		t.Fatalf("e2e: read reservations: %v", err)
	}
	type late struct{ typ, fate string }
	lates := map[uuid.UUID][]late{}
	expired := map[uuid.UUID]bool{}
	if err := scanRows(ctx, sys, "order", `SELECT o.id, coalesce(t.event_type, ''), coalesce(t.late, '') FROM orders o
		LEFT JOIN order_timeline t ON t.order_id = o.id AND t.late <> '' WHERE o.status = 'EXPIRED'`, func(scan func(...any) error) error {
		var id uuid.UUID
		var l late
		if err := scan(&id, &l.typ, &l.fate); err != nil {
			return err
		}
		expired[id] = true
		if l.typ != "" {
			lates[id] = append(lates[id], l)
		}
		return nil
	}); err != nil {
		t.Fatalf("e2e: read late replies: %v", err)
	}
	counts := map[string]int{}
	for id := range expired {
		var want late
		switch reservations[id] {
		case "RELEASED":
			want = late{string(event.StockReserved), "released"}
		case "REJECTED":
			want = late{string(event.StockRejected), "unchanged"}
		default:
			continue // inventory never decided it: no reply
		}
		if !slices.Contains(lates[id], want) {
			t.Errorf("e2e: expired order %s has reservation %s but no late %s (%s) on its timeline: %v", id, reservations[id], want.typ, want.fate, lates[id])
		}
		counts[want.fate]++
	}
	total := 0
	for _, ls := range lates {
		total += len(ls)
	}
	t.Logf("late replies: %d on %d expired orders (inventory's: released=%d unchanged=%d)", total, len(expired), counts["released"], counts["unchanged"])
	if counts["released"]+counts["unchanged"] < scaled(100) {
		t.Errorf("e2e: %d of the stalled inventory's replies arrived late, want hundreds", counts["released"]+counts["unchanged"])
	}
}

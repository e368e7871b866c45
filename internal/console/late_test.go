package console_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestConsoleShowsALateReply stalls inventory past an order's deadline, as
// an operator pauses its durables, and resumes it once the order has
// expired: inventory then reserves for the expired order, its
// StockReserved reaches the order service late and inventory releases the
// reservation. The saga picture and the events table mark that reply, and
// payment's refund, late with their fates (docs/saga.md): exactly the
// replies the order service recorded as late.
func TestConsoleShowsALateReply(t *testing.T) {
	t.Parallel()
	needsBrowser(t)
	s := start(t, "ORDER_DEADLINE=2s")
	ctx := browser(t)
	stalled := []struct{ stream, durable string }{
		{streams.Payments, streams.InventoryPayments},
		{streams.Orders, streams.InventoryExpiries},
	}
	for _, c := range stalled {
		resp, err := s.js.PauseConsumer(t.Context(), c.stream, c.durable, time.Now().Add(time.Hour))
		require.NoError(t, err)
		require.True(t, resp.Paused, c.durable)
	}
	id := s.placeOrder(t, "alice", `{"sku":"apple","quantity":2}`)
	s.awaitOrder(t, `SELECT status = 'EXPIRED' FROM orders WHERE id = $1`, id)
	// inventory-expiries resumes after inventory-payments has reserved:
	// together, the OrderExpired could come first and leave nothing to
	// reserve, and no reply to be late.
	_, err := s.js.ResumeConsumer(t.Context(), streams.Payments, streams.InventoryPayments)
	require.NoError(t, err)
	s.awaitOrder(t, `SELECT count(*) = 1 FROM order_timeline WHERE order_id = $1 AND late = 'released'`, id)
	_, err = s.js.ResumeConsumer(t.Context(), streams.Orders, streams.InventoryExpiries)
	require.NoError(t, err)

	s.signIn(t, ctx, "/orders/"+id)
	awaitText(t, ctx, "#order-status", "EXPIRED")
	awaitText(t, ctx, "#saga", "the saga is over")
	// The replies that came after the expiry, by the order service's
	// record: inventory's reservation (released), arranged by the pause,
	// and payment's refund (unchanged); the debit too (refunded) when
	// payment was slower than the deadline.
	var want []string
	rows, err := s.pools["order"].Query(t.Context(), `SELECT late || ' ' || event_type FROM order_timeline WHERE order_id = $1 AND late <> ''`, id)
	require.NoError(t, err)
	for rows.Next() {
		var l string
		require.NoError(t, rows.Scan(&l))
		want = append(want, l)
	}
	require.NoError(t, rows.Err())
	require.Contains(t, want, "released "+string(event.StockReserved))
	require.Contains(t, want, "unchanged "+string(event.PaymentRefunded))

	// The picture marks exactly those hops, to the order service, with
	// their fates; the table marks their rows.
	hops, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#saga svg g.hop.late")].map(g => g.dataset.late + " " + g.querySelector("title").textContent.split(" ")[0])`))
	require.NoError(t, err)
	require.ElementsMatch(t, want, hops)
	label, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#saga svg g.hop.late[data-late="released"]').textContent`))
	require.NoError(t, err)
	require.Contains(t, label, "StockReserved")
	require.Contains(t, label, "late: released")
	require.Contains(t, label, "→ order-inventory (late: the order was over; released)", "the tooltip says why")
	labels, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#saga svg g.hop text").length`))
	require.NoError(t, err)
	labelled, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll("#saga svg g.hop text")].filter(t => t.textContent.includes("late:")).length`))
	require.NoError(t, err)
	require.Len(t, want, labelled, "only the late hops' labels say late (of %d labels)", labels)
	tableRows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#hops tr.late")].map(r => r.dataset.late + " " + r.textContent)`))
	require.NoError(t, err)
	require.Len(t, tableRows, len(want))
	require.True(t, slices.ContainsFunc(tableRows, func(r string) bool {
		return strings.HasPrefix(r, "released ") && strings.Contains(r, "StockReserved") && strings.Contains(r, "late: released") && strings.Contains(r, "order-inventory")
	}), "table rows: %v", tableRows)
	screenshot(t, ctx, "console-late-reply.png")
}

// awaitOrder waits until query, a boolean of the order id on the order
// database, is true.
func (s *system) awaitOrder(t *testing.T, query, id string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var ok bool
		require.NoError(c, s.pools["order"].QueryRow(context.Background(), query, id).Scan(&ok))
		require.True(c, ok)
	}, waitFor, 50*time.Millisecond, "%s", query)
}

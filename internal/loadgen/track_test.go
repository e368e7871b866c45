package loadgen

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A customer is polled once per interval, and not before its oldest pending
// order has had an interval to finish: polls spread over the interval
// instead of reading every customer at once.
func TestJobsAreDueAnIntervalAfterPlacingOrPolling(t *testing.T) {
	const interval = time.Second
	tr := newTracker()
	tr.add(orderView{ID: "o1", CustomerID: "fresh", Status: "PENDING"})
	tr.add(orderView{ID: "o2", CustomerID: "waited", Status: "PENDING"})
	tr.add(orderView{ID: "o3", CustomerID: "polled", Status: "PENDING"})
	tr.add(orderView{ID: "o4", CustomerID: "done", Status: statusConfirmed})
	now := time.Now()
	tr.pendingIDs["o2"].placed = now.Add(-interval)
	tr.pendingIDs["o3"].placed = now.Add(-interval)
	tr.customers["polled"].lastPolled = now.Add(-interval / 2)

	customers := func(jobs []pollJob) (ids []string) {
		for _, j := range jobs {
			ids = append(ids, j.customer)
		}
		return ids
	}
	require.Equal(t, []string{"waited"}, customers(tr.jobs(1000, interval, now)), "due now")
	require.Empty(t, customers(tr.jobs(1000, interval, now)), "due again at once")
	require.ElementsMatch(t, []string{"fresh", "polled", "waited"},
		customers(tr.jobs(1000, interval, now.Add(interval))), "due an interval later")
}

// Once placing ended, a poll reads settleBudgetFactor times as much: a
// backlog of orders not yet seen finished is worked off within the settle
// time.
func TestPollsReadMoreWhileSettling(t *testing.T) {
	var lists atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/token":
			_, _ = w.Write([]byte(`{"access_token": "a-token"}`))
			return
		case "/orders":
			lists.Add(1)
		}
		_, _ = w.Write([]byte(`{"orders": []}`))
	}))
	t.Cleanup(srv.Close)

	const customers = 200
	polled := func(settling bool) int32 {
		cfg := Config{OrderURL: srv.URL, IssuerURL: srv.URL, PollInterval: time.Second}
		r := &run{cfg: cfg, client: &client{http: srv.Client(), cfg: cfg}, tracker: newTracker()}
		for i := range customers {
			id := fmt.Sprint("o", i)
			r.tracker.add(orderView{ID: id, CustomerID: fmt.Sprint("c", i), Status: "PENDING"})
			r.tracker.pendingIDs[id].placed = time.Now().Add(-time.Minute)
		}
		lists.Store(0)
		r.poll(t.Context(), settling)
		return lists.Load()
	}
	measuring, settling := polled(false), polled(true)
	require.Less(t, measuring, int32(customers), "a poll's budget covers part of the customers")
	require.Greater(t, settling, measuring)
	require.Equal(t, min(settleBudgetFactor*measuring, customers), settling)
}

// An order the saga did not finish by its deadline is finished too: it
// leaves the pending orders, counts as expired, and its time to terminal
// is its expiry event's, not the poll's.
func TestAnExpiredOrderIsFinished(t *testing.T) {
	tr := newTracker()
	placed := time.Now().Add(-time.Minute)
	tr.add(orderView{ID: "o1", CustomerID: "c", Status: "PENDING", CreatedAt: placed})
	tr.update(orderView{ID: "o1", CustomerID: "c", Status: statusExpired, CreatedAt: placed, UpdatedAt: time.Now(),
		Timeline: []timelineEntry{
			{Type: typePlaced, At: placed},
			{Type: typeExpired, At: placed.Add(30 * time.Second)},
		}})
	require.Empty(t, tr.pendingIDs, "an expired order is still awaited")
	require.Empty(t, tr.customers["c"].pending)
	require.Equal(t, map[string]int{statusExpired: 1}, tr.outcomes)
	require.Equal(t, []time.Duration{30 * time.Second}, tr.toTerminal)
	require.Empty(t, tr.toConfirmed)
}

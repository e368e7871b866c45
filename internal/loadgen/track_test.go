package loadgen

import (
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

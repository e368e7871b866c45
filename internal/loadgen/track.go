package loadgen

import (
	"slices"
	"sync"
	"time"
)

// Order statuses and the event types of the timeline that Run reads.
const (
	statusConfirmed = "CONFIRMED"
	statusRejected  = "REJECTED"
	statusCancelled = "CANCELLED"
	// statusExpired ends an order the saga did not finish by its deadline.
	statusExpired = "EXPIRED"

	typePlaced    = "onceflow.order.placed.v1"
	typeConfirmed = "onceflow.order.confirmed.v1"
	typeRejected  = "onceflow.order.rejected.v1"
	typeCancelled = "onceflow.order.cancelled.v1"
	typeExpired   = "onceflow.order.expired.v1"
)

func terminal(status string) bool {
	switch status {
	case statusConfirmed, statusRejected, statusCancelled, statusExpired:
		return true
	}
	return false
}

// orderView is what Run reads of an order from the API.
type orderView struct {
	ID         string          `json:"id"`
	CustomerID string          `json:"customer_id"`
	Status     string          `json:"status"`
	Timeline   []timelineEntry `json:"timeline"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
}

type timelineEntry struct {
	Type string    `json:"type"`
	At   time.Time `json:"at"`
}

// times returns when the order was placed and when it reached its terminal
// state, by its timeline (updated_at if the terminal event is missing).
func (o orderView) times() (placed, done time.Time) {
	placed, done = o.CreatedAt, o.UpdatedAt
	for _, e := range o.Timeline {
		switch e.Type {
		case typePlaced:
			placed = e.At
		case typeConfirmed, typeRejected, typeCancelled, typeExpired:
			done = e.At
		}
	}
	return placed, done
}

// tracked is a placed order not yet seen in a terminal state.
type tracked struct {
	id      string
	seq     int       // its place among its customer's orders, from 0
	placed  time.Time // when its POST answered
	checked time.Time // when it was placed or last looked up on its own
}

// customerOrders are one customer's orders as the tracker knows them.
type customerOrders struct {
	id         string
	placed     int        // orders placed so far
	pending    []*tracked // not finished, in placement order
	lastPolled time.Time
}

// tracker follows every placed order to its terminal state.
type tracker struct {
	mu         sync.Mutex
	customers  map[string]*customerOrders
	pendingIDs map[string]*tracked
	placed     int
	outcomes   map[string]int
	// Latencies by the order service's clock, and the span of the run.
	toConfirmed, toTerminal   []time.Duration
	firstPlaced, lastFinished time.Time
}

func newTracker() *tracker {
	return &tracker{
		customers:  map[string]*customerOrders{},
		pendingIDs: map[string]*tracked{},
		outcomes:   map[string]int{},
	}
}

// add records a placed order, which may already be finished.
func (t *tracker) add(o orderView) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.pendingIDs[o.ID]; dup {
		return
	}
	t.placed++
	c := t.customers[o.CustomerID]
	if c == nil {
		c = &customerOrders{id: o.CustomerID}
		t.customers[o.CustomerID] = c
	}
	now := time.Now()
	tr := &tracked{id: o.ID, seq: c.placed, placed: now, checked: now}
	c.placed++
	c.pending = append(c.pending, tr)
	t.pendingIDs[o.ID] = tr
	t.updateLocked(o)
}

// update records what an answer says about an order; it ignores orders the
// tracker does not follow, and orders not finished yet.
func (t *tracker) update(orders ...orderView) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, o := range orders {
		t.updateLocked(o)
	}
}

func (t *tracker) updateLocked(o orderView) {
	tr, ok := t.pendingIDs[o.ID]
	if !ok || !terminal(o.Status) {
		return
	}
	delete(t.pendingIDs, o.ID)
	c := t.customers[o.CustomerID]
	c.pending = slices.DeleteFunc(c.pending, func(p *tracked) bool { return p == tr })

	placed, done := o.times()
	t.outcomes[o.Status]++
	t.toTerminal = append(t.toTerminal, done.Sub(placed))
	if o.Status == statusConfirmed {
		t.toConfirmed = append(t.toConfirmed, done.Sub(placed))
	}
	if t.firstPlaced.IsZero() || placed.Before(t.firstPlaced) {
		t.firstPlaced = placed
	}
	if done.After(t.lastFinished) {
		t.lastFinished = done
	}
}

// pollJob is what one poll asks about one customer: its newest limit
// orders, which show its pending orders unless they are many or were
// created long before their POST answered; due are the pending orders to
// look up one by one if the list does not show them.
type pollJob struct {
	customer string
	limit    int
	due      []string
}

// Bounds of the work of polls. A list shows at most maxListLimit orders
// (GET /orders allows 500; its cost grows with the orders it shows). A
// pending order the lists do not show is looked up on its own at most
// every singleEvery, and at most maxSingles of a customer's per poll.
const (
	maxListLimit = 100
	maxSingles   = 8
	singleEvery  = time.Second
	// singleCost is what looking up one order costs, in orders listed: a
	// request of its own.
	singleCost = 3
)

// listSlack widens a customer's list beyond its orders since the oldest
// pending one, for orders created in another order than they were placed.
const listSlack = 2

// jobs returns the poll jobs of the customers that are due: with pending
// orders, and neither polled nor given a new order within the last
// interval. Those polled longest ago come first, as many as budget (orders
// shown) allows but at least one. A backlog of unfinished orders is thus
// looked at less often instead of making every poll dearer: the latencies
// come from the timelines, so when an order is seen finished changes no
// figure.
func (t *tracker) jobs(budget int, interval time.Duration, now time.Time) []pollJob {
	t.mu.Lock()
	defer t.mu.Unlock()
	var customers []*customerOrders
	for _, c := range t.customers {
		if len(c.pending) > 0 && now.Sub(c.lastPolled) >= interval && now.Sub(c.pending[0].placed) >= interval {
			customers = append(customers, c)
		}
	}
	slices.SortFunc(customers, func(a, b *customerOrders) int { return a.lastPolled.Compare(b.lastPolled) })
	var jobs []pollJob
	spent := 0
	for _, c := range customers {
		j := pollJob{customer: c.id, limit: min(c.placed-c.pending[0].seq+listSlack, maxListLimit)}
		for _, p := range c.pending {
			if now.Sub(p.checked) >= singleEvery {
				j.due = append(j.due, p.id)
			}
		}
		cost := j.limit + singleCost*min(len(j.due), maxSingles)
		if len(jobs) > 0 && spent+cost > budget {
			break
		}
		spent += cost
		c.lastPolled = now
		jobs = append(jobs, j)
	}
	return jobs
}

// check reports whether the pending order id is to be looked up on its own
// now, and if so records that it is.
func (t *tracker) check(id string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pendingIDs[id]
	if !ok || now.Sub(p.checked) < singleEvery {
		return false
	}
	p.checked = now
	return true
}

// counts returns how many orders were placed and how many are pending.
func (t *tracker) counts() (placed, pending int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.placed, len(t.pendingIDs)
}

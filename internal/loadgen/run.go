package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// maxErrorSamples is how many distinct placement errors a Result keeps.
const maxErrorSamples = 5

// place places orders from start for cfg.Duration, at cfg.Rate or as fast
// as cfg.Concurrency workers can.
func (r *run) place(ctx context.Context, start time.Time) {
	end := start.Add(r.cfg.Duration)
	placeCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	// A request already sent is retried beyond the placing deadline: its
	// order may exist, and only its key can tell.
	retryCtx, cancelRetries := context.WithTimeout(ctx, r.cfg.Duration+r.cfg.SettleTimeout)
	defer cancelRetries()

	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := range r.cfg.Concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(w)))
			for n := range jobs {
				r.placeOne(retryCtx, rng, n)
			}
		})
	}
	interval := time.Duration(0)
	if r.cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) / r.cfg.Rate)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for n := 0; ; n++ {
		if interval > 0 {
			// On a schedule from start: a worker shortage delays orders,
			// and they are sent as soon as workers are free again. An
			// order due at the end or later is not placed, however late
			// the deadline's cancellation is noticed on a busy machine.
			at := start.Add(time.Duration(n) * interval)
			if !at.Before(end) {
				break loop
			}
			timer.Reset(time.Until(at))
			select {
			case <-placeCtx.Done():
				break loop
			case <-timer.C:
			}
		}
		select {
		case <-placeCtx.Done():
			break loop
		case jobs <- n:
		}
	}
	r.placingEnded.Store(time.Now().UnixNano())
	close(jobs)
	wg.Wait()
}

// placeOne places order n, retrying with its Idempotency-Key until it is
// placed, refused for good, or ctx ends.
func (r *run) placeOne(ctx context.Context, rng *rand.Rand, n int) {
	req := r.world.newOrder(rng, r.cfg.PoorShare, r.cfg.ScarceShare)
	key := "lg-" + r.cfg.RunID + "-" + strconv.Itoa(n)
	t0 := time.Now()
	var o orderView
	err := retry(ctx, func() { r.retries.Add(1) }, func() error {
		return r.client.do(ctx, customer(req.CustomerID), "POST", r.cfg.OrderURL+"/orders", key, req, &o)
	})
	lat := time.Since(t0)
	if err != nil {
		r.placeErrors.Add(1)
		r.mu.Lock()
		if msg := err.Error(); len(r.errorSamples) < maxErrorSamples {
			r.errorSamples = append(r.errorSamples, msg)
		}
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.placeLatency = append(r.placeLatency, lat)
	r.mu.Unlock()
	r.tracker.add(o)
}

// pollParallelism bounds the requests of one poll.
const pollParallelism = 8

// pollBudget is the most orders one poll shows per second of PollInterval
// (lists and single lookups): about twice what a healthy run at 1,000
// orders/s needs.
const pollBudget = 2000

// settleBudgetFactor multiplies pollBudget once placing ended.
const settleBudgetFactor = 5

// pollSlices is how many polls share out one PollInterval's requests. Each
// customer is still looked at once per PollInterval, but the order service
// sees an even stream of reads instead of a burst each interval, which
// would stall the saga's own statements and show in its latency.
const pollSlices = 10

// follow polls the pending orders until placing ended and every order is
// finished, or the settle time-out passed since placing ended.
func (r *run) follow(ctx context.Context, placingDone <-chan struct{}) error {
	ticker := time.NewTicker(r.cfg.PollInterval / pollSlices)
	defer ticker.Stop()
	var settled <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-placingDone:
			placingDone = nil
			settle := time.NewTimer(r.cfg.SettleTimeout)
			defer settle.Stop()
			settled = settle.C
			continue
		case <-settled:
			return nil
		case <-ticker.C:
		}
		r.poll(ctx, placingDone == nil)
		if _, pending := r.tracker.counts(); placingDone == nil && pending == 0 {
			return nil
		}
	}
}

// poll lists the recent orders of customers with pending ones, and looks
// up one by one the pending orders those lists do not show. Once placing
// ended (settling), it may read settleBudgetFactor times as much: no
// placing is measured any more, and a backlog of orders not yet seen
// finished, left by a run at full speed, is worked off within the settle
// time instead of customer by customer.
func (r *run) poll(ctx context.Context, settling bool) {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(pollParallelism)
	budget := int(pollBudget * r.cfg.PollInterval.Seconds() / pollSlices)
	if settling {
		budget *= settleBudgetFactor
	}
	for _, j := range r.tracker.jobs(budget, r.cfg.PollInterval, time.Now()) {
		g.Go(func() error {
			var list struct {
				Orders []orderView `json:"orders"`
			}
			u := fmt.Sprintf("%s/orders?limit=%d", r.cfg.OrderURL, j.limit) // the customer's own
			r.pollRequests.Add(1)
			if err := r.client.do(ctx, customer(j.customer), "GET", u, "", nil, &list); err == nil {
				r.tracker.update(list.Orders...)
			} // else the next poll tries again
			shown := make(map[string]bool, len(list.Orders))
			for _, o := range list.Orders {
				shown[o.ID] = true
			}
			singles := 0
			for _, id := range j.due {
				if singles == maxSingles {
					break
				}
				if shown[id] || !r.tracker.check(id, time.Now()) {
					continue
				}
				singles++
				var o orderView
				r.pollRequests.Add(1)
				if err := r.client.do(ctx, customer(j.customer), "GET", r.cfg.OrderURL+"/orders/"+url.PathEscape(id), "", nil, &o); err == nil {
					r.tracker.update(o)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
}

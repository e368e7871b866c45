package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"
)

// LatencySource says how the latencies of a Result are measured.
const LatencySource = "order timeline: time of the OrderPlaced event to the time of the terminal event, both by the order service's clock"

// Result is what a Run measured. Rates are per second; latencies are in
// milliseconds.
type Result struct {
	RunID       string    `json:"run_id"`
	Started     time.Time `json:"started"`
	TargetRate  float64   `json:"target_rate"` // 0: as fast as possible
	Concurrency int       `json:"concurrency"`
	Duration    float64   `json:"duration_seconds"` // of placing
	Interrupted bool      `json:"interrupted,omitempty"`

	Placed       int      `json:"placed"`
	PlaceErrors  int64    `json:"place_errors"`  // orders given up on
	Retries      int64    `json:"retries"`       // POSTs sent again with the same key
	PollRequests int64    `json:"poll_requests"` // GETs to follow the orders
	ErrorSamples []string `json:"error_samples,omitempty"`

	// Outcomes counts the placed orders by terminal status; Unfinished are
	// those not terminal when the run gave up waiting.
	Outcomes   map[string]int `json:"outcomes"`
	Unfinished int            `json:"unfinished"`

	// PlacedPerSecond is placed orders over the placing time.
	PlacedPerSecond float64 `json:"placed_per_second"`
	// FinishedPerSecond is orders that reached a terminal state over the
	// time from the first OrderPlaced to the last terminal event.
	FinishedPerSecond float64 `json:"finished_per_second"`

	LatencySource     string  `json:"latency_source"`
	PlacedToConfirmed Latency `json:"placed_to_confirmed_ms"`
	PlacedToTerminal  Latency `json:"placed_to_terminal_ms"`
	// PostOrder is the client's POST /orders latency, retries included.
	PostOrder Latency `json:"post_order_ms"`

	// Histogram is PlacedToConfirmed in buckets, as WriteHistogram draws it.
	Histogram []Bucket `json:"placed_to_confirmed_histogram"`

	confirmed []time.Duration
}

// Latency summarises a set of durations, in milliseconds.
type Latency struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Bucket is one bar of a latency histogram: Count durations in [From, To)
// milliseconds; the overflow bucket holds those from From to the maximum,
// To.
type Bucket struct {
	From     float64 `json:"from_ms"`
	To       float64 `json:"to_ms"`
	Count    int     `json:"count"`
	Overflow bool    `json:"overflow,omitempty"`
}

func (r *run) result(start time.Time) *Result {
	t := r.tracker
	t.mu.Lock()
	defer t.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()

	placingTime := time.Duration(r.placingEnded.Load() - start.UnixNano())
	res := &Result{
		RunID:             r.cfg.RunID,
		Started:           start,
		TargetRate:        r.cfg.Rate,
		Concurrency:       r.cfg.Concurrency,
		Duration:          placingTime.Seconds(),
		Placed:            t.placed,
		PlaceErrors:       r.placeErrors.Load(),
		Retries:           r.retries.Load(),
		PollRequests:      r.pollRequests.Load(),
		ErrorSamples:      slices.Clone(r.errorSamples),
		Outcomes:          map[string]int{},
		Unfinished:        len(t.pendingIDs),
		LatencySource:     LatencySource,
		PlacedToConfirmed: summarize(t.toConfirmed),
		PlacedToTerminal:  summarize(t.toTerminal),
		PostOrder:         summarize(r.placeLatency),
		confirmed:         slices.Clone(t.toConfirmed),
	}
	finished := 0
	for s, n := range t.outcomes {
		res.Outcomes[s] = n
		finished += n
	}
	if placingTime > 0 {
		res.PlacedPerSecond = float64(t.placed) / placingTime.Seconds()
	}
	if span := t.lastFinished.Sub(t.firstPlaced); finished > 0 && span > 0 {
		res.FinishedPerSecond = float64(finished) / span.Seconds()
	}
	res.Histogram = histogram(res.confirmed)
	return res
}

// summarize returns the mean, the nearest-rank percentiles and the maximum
// of ds.
func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	sorted := slices.Sorted(slices.Values(ds))
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return Latency{
		Count: len(sorted),
		Mean:  ms(sum / time.Duration(len(sorted))),
		P50:   ms(percentile(sorted, 50)),
		P95:   ms(percentile(sorted, 95)),
		P99:   ms(percentile(sorted, 99)),
		Max:   ms(sorted[len(sorted)-1]),
	}
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

// WriteJSON writes r to path as indented JSON.
func (r *Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// WriteText writes a summary of r for a person.
func (r *Result) WriteText(w io.Writer) {
	target := "as fast as possible"
	if r.TargetRate > 0 {
		target = fmt.Sprintf("%g orders/s", r.TargetRate)
	}
	fmt.Fprintf(w, "run %s: %s for %.1fs, %d concurrent clients\n", r.RunID, target, r.Duration, r.Concurrency)
	if r.Interrupted {
		fmt.Fprintln(w, "  interrupted: the figures cover the run until then")
	}
	fmt.Fprintf(w, "  placed      %d (%.1f/s), %d given up, %d retries with the same key\n",
		r.Placed, r.PlacedPerSecond, r.PlaceErrors, r.Retries)
	fmt.Fprintf(w, "  finished    %.1f orders/s to a terminal state: %d confirmed, %d rejected, %d cancelled, %d expired, %d unfinished\n",
		r.FinishedPerSecond, r.Outcomes[statusConfirmed], r.Outcomes[statusRejected], r.Outcomes[statusCancelled], r.Outcomes[statusExpired], r.Unfinished)
	l := r.PlacedToConfirmed
	fmt.Fprintf(w, "  placed→confirmed  p50 %.1fms  p95 %.1fms  p99 %.1fms  max %.1fms  (n=%d)\n", l.P50, l.P95, l.P99, l.Max, l.Count)
	l = r.PlacedToTerminal
	fmt.Fprintf(w, "  placed→terminal   p50 %.1fms  p95 %.1fms  p99 %.1fms  max %.1fms  (n=%d)\n", l.P50, l.P95, l.P99, l.Max, l.Count)
	l = r.PostOrder
	fmt.Fprintf(w, "  POST /orders      p50 %.1fms  p95 %.1fms  p99 %.1fms  max %.1fms  (client side)\n", l.P50, l.P95, l.P99, l.Max)
	fmt.Fprintf(w, "  latencies from the %s\n", LatencySource)
	for _, e := range r.ErrorSamples {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}

// Command report reads the output of the bench package's benchmarks (one or
// more runs, as `go test -bench -count N` prints them) on standard input and
// prints every events/s figure, the median of its runs, and the ratios the
// project's performance targets are stated in, each marked met or missed.
//
// A ratio is taken round by round, its two figures from the same round, and
// the median of the rounds' ratios is the one judged: the machine's speed
// drifts by a third from one hour to the next, and a ratio of two medians
// may pair a figure of a fast round with one of a slow round. A line
// "# round N" (bench/run.sh writes one before each round) starts round N;
// without such lines, the k-th result of a benchmark is of round k. Within
// a round, the k-th result of one figure pairs with the k-th of the other.
// Where the benchmarks measured the machine's CPU time per event, it prints
// that too, and the rate it allows with every core busy: a figure far below
// that rate waits on something (round trips, locks, fsyncs); one close to
// it needs less work per event, or more cores.
//
//	go test -run '^$' -bench . ./bench | go run ./bench/report
package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// line matches a benchmark result with an events/s metric; the name loses
// its -GOMAXPROCS suffix.
var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+.*?\s([\d.]+) events/s`)

// metric matches one optional metric of a result line: the machine's CPU
// time per event, and the share of it the benchmark's own process spent.
func metric(unit string) *regexp.Regexp {
	return regexp.MustCompile(`\s([\d.]+) ` + regexp.QuoteMeta(unit) + `(\s|$)`)
}

var (
	cpuMetric  = metric("cpu-us/event")
	selfMetric = metric("self-share")
	// roundMarker starts a round (bench/run.sh).
	roundMarker = regexp.MustCompile(`^# round (\d+)\s*$`)
)

func run(in io.Reader, out io.Writer) error {
	runs := map[string][]float64{}
	byRound := map[string]map[int][]float64{} // runs[name] by round
	round := 0                                // the current marked round; 0 before any marker
	cpu := map[string][]float64{}             // µs of CPU time per event
	self := map[string][]float64{}            // the benchmark process's share of it
	metrics := []struct {
		re   *regexp.Regexp
		into map[string][]float64
	}{{cpuMetric, cpu}, {selfMetric, self}}
	var names []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if r := roundMarker.FindStringSubmatch(sc.Text()); r != nil {
			round, _ = strconv.Atoi(r[1]) // \d+ that overflows an int is no round anyway
			continue
		}
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return fmt.Errorf("parse %q: %w", sc.Text(), err)
		}
		name := strings.TrimPrefix(m[1], "Benchmark")
		if _, ok := runs[name]; !ok {
			names = append(names, name)
			byRound[name] = map[int][]float64{}
		}
		runs[name] = append(runs[name], v)
		r := round
		if r == 0 {
			r = len(runs[name])
		}
		byRound[name][r] = append(byRound[name][r], v)
		for _, o := range metrics {
			if c := o.re.FindStringSubmatch(sc.Text()); c != nil {
				f, err := strconv.ParseFloat(c[1], 64)
				if err != nil {
					return fmt.Errorf("parse %q: %w", sc.Text(), err)
				}
				o.into[name] = append(o.into[name], f)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("no benchmark results with events/s on input")
	}
	rate := map[string]float64{}
	cores := runtime.NumCPU()
	fmt.Fprintf(out, "%-52s %12s %12s %12s %8s  %s\n", "benchmark", "events/s", "cpu µs/ev", fmt.Sprintf("%d-core cap", cores), "self", "runs")
	for _, name := range names {
		rate[name] = median(runs[name])
		usage, ceiling, share := "", "", ""
		if us := cpu[name]; len(us) > 0 && median(us) > 0 {
			usage = strconv.FormatFloat(median(us), 'f', 1, 64)
			ceiling = strconv.FormatFloat(float64(cores)*1e6/median(us), 'f', 0, 64)
		}
		if sh := self[name]; len(sh) > 0 {
			share = strconv.FormatFloat(100*median(sh), 'f', 0, 64) + " %"
		}
		fmt.Fprintf(out, "%-52s %12.0f %12s %12s %8s  %s\n", name, rate[name], usage, ceiling, share, fmtRuns(runs[name]))
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%-74s %9s %9s  %-7s %s\n", "target", "measured", "needed", "", "rounds")
	for _, t := range targets() {
		got, perRound, ok := t.value(rate, byRound)
		if !ok {
			continue
		}
		verdict := "met"
		if (t.atMost && got > t.bound) || (!t.atMost && got < t.bound) {
			verdict = "MISSED"
		}
		cmp := "≥"
		if t.atMost {
			cmp = "≤"
		}
		each := make([]string, len(perRound))
		for i, v := range perRound {
			each[i] = t.format(v)
		}
		fmt.Fprintf(out, "%-74s %9s %s%8s  %-7s %s\n", t.name, t.format(got), cmp, t.format(t.bound), verdict, strings.Join(each, " "))
	}
	return nil
}

// target is one of the performance targets: a ratio of two figures
// (or one figure) and its bound.
type target struct {
	name     string
	num, den string // den empty: an absolute events/s figure
	bound    float64
	atMost   bool
}

// value returns the figure a target is judged on and, for a ratio, the
// rounds' ratios it is the median of. An absolute target is judged on the
// median rate. A ratio is missing (ok is false) when no round measured
// both of its figures.
func (t target) value(rate map[string]float64, byRound map[string]map[int][]float64) (got float64, ratios []float64, ok bool) {
	if t.den == "" {
		got, ok = rate[t.num]
		return got, nil, ok
	}
	for _, r := range slices.Sorted(maps.Keys(byRound[t.num])) {
		nums, dens := byRound[t.num][r], byRound[t.den][r]
		for i := range min(len(nums), len(dens)) {
			if nums[i] > 0 && dens[i] > 0 {
				ratios = append(ratios, nums[i]/dens[i])
			}
		}
	}
	if len(ratios) == 0 {
		return 0, nil, false
	}
	return median(ratios), ratios, true
}

func (t target) format(v float64) string {
	if t.den == "" {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "×"
}

func targets() []target {
	var ts []target
	for _, pg := range []string{"durable", "fast"} {
		p := "pg=" + pg
		ts = append(ts,
			target{name: p + ": batched inbox / batched DB limit (its statements)", num: "Inbox/" + p + "/mode=batched/workers=1", den: "DBLimit/" + p + "/mode=batch/conns=1", bound: 0.6},
			target{name: p + ": set-based inbox / set-based DB limit", num: "Inbox/" + p + "/mode=setbased/workers=1", den: "DBLimit/" + p + "/mode=setbased/conns=1", bound: 0.6},
			target{name: p + ": unbatched inbox / 1-event-per-tx DB limit (its statements), 1 connection", num: "Inbox/" + p + "/mode=unbatched/workers=1", den: "DBLimit/" + p + "/mode=tx1/conns=1", bound: 0.8},
			target{name: p + ": unbatched inbox / 1-event-per-tx DB limit (its statements), 4 connections", num: "Inbox/" + p + "/mode=unbatched/workers=4", den: "DBLimit/" + p + "/mode=tx1/conns=4", bound: 0.8},
		)
		for _, m := range []string{"unbatched/workers=1", "unbatched/workers=4", "batched/workers=1", "setbased/workers=1"} {
			// Time per event is the inverse of the rate.
			ts = append(ts, target{name: p + ": inbox time per event / naive, " + m, num: "Naive/" + p + "/mode=" + m, den: "Inbox/" + p + "/mode=" + m, bound: 1.3, atMost: true})
		}
		for _, fsync := range []string{"default", "always"} {
			ts = append(ts, target{name: p + ": relay / async publish, nats fsync " + fsync, num: "Relay/" + p + "/fsync=" + fsync, den: "Broker/op=publish/fsync=" + fsync, bound: 0.5})
		}
		ts = append(ts, target{name: p + ": relay publishing atomic batches / async publish, nats fsync always", num: "Relay/" + p + "/fsync=always/publish=atomic", den: "Broker/op=publish/fsync=always", bound: 0.5})
		ts = append(ts, target{name: p + ": relay / Watermill forwarder", num: "Relay/" + p + "/fsync=default", den: "Watermill/" + p + "/fsync=default", bound: 10})
	}
	ts = append(ts,
		target{name: "pg=durable: batched inbox, events/s", num: "Inbox/pg=durable/mode=batched/workers=1", bound: 10_000},
		target{name: "pg=durable: set-based inbox, events/s", num: "Inbox/pg=durable/mode=setbased/workers=1", bound: 20_000},
		target{name: "pg=durable: payment set-based, events/s", num: "Payment/pg=durable/mode=setbased", bound: 20_000},
		target{name: "pg=durable: inventory set-based, events/s", num: "Inventory/pg=durable/mode=setbased", bound: 20_000},
		target{name: "pg=durable: payment set-based, 2 workers, events/s", num: "Payment/pg=durable/mode=setbased/workers=2", bound: 20_000},
		target{name: "pg=durable: inventory set-based, 2 workers, events/s", num: "Inventory/pg=durable/mode=setbased/workers=2", bound: 20_000},
	)
	return ts
}

func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRuns(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(parts, " ")
}

// Command soak reads the samples bench/soak.sh took of its two variants
// (the row-deleting cleaners of the release before partitioning, and the
// partitioned inbox and outbox), prints them side by side, judges the
// targets of retention by partitions, and draws the tables' size and the
// placed→confirmed p99 over the run as an SVG.
//
//	go run ./bench/soak -old old.csv -new new.csv -svg soak.svg
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// sample is one row of a variant's CSV, with the rates derived from it.
type sample struct {
	T          int     // seconds since the start
	Placed     float64 // orders placed in the sample
	Throughput float64 // orders confirmed per second
	P50, P99   float64 // placed→confirmed, ms
	Size       float64 // inbox and outbox, MB, every database
	DeadIn     int64   // dead tuples of the inbox
	DeadOut    int64   // dead tuples of the outbox
	CleanupMax float64 // the cleanup's longest statement, ms, its lock waits included
	HeldMax    float64 // the longest a partition step held its lock, ms
	WaitMax    float64 // the longest a service's statement waited for a table lock, ms
	WALPer     float64 // WAL bytes per order placed in the sample
	Load       float64 // the machine's load average (1 minute)
}

func run(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	oldPath := fs.String("old", "", "CSV of the row-deleting variant")
	newPath := fs.String("new", "", "CSV of the partitioned variant")
	settle := fs.Int("settle", 300, "seconds after which retention is reached (flatness is judged from there)")
	svgPath := fs.String("svg", "", "draw size and p99 over the run to `FILE`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	old, err := read(*oldPath)
	if err != nil {
		return err
	}
	part, err := read(*newPath)
	if err != nil {
		return err
	}
	print(w, "row-deleting cleaners (old)", old)
	print(w, "partitions (new)", part)
	judge(w, old, part, *settle)
	if *svgPath != "" {
		return os.WriteFile(*svgPath, []byte(plot(old, part)), 0o644)
	}
	return nil
}

// read reads a variant's samples; each counts the orders since the one
// before it (the first, since SAMPLE seconds before it).
func read(path string) ([]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []sample
	var lastWAL float64
	lastT := 0
	for i, r := range rows {
		if i == 0 {
			continue // header
		}
		if len(r) != 13 {
			return nil, fmt.Errorf("%s line %d: %d fields, want 13", path, i+1, len(r))
		}
		v := make([]float64, len(r))
		for j, s := range r {
			if v[j], err = strconv.ParseFloat(strings.TrimSpace(s), 64); err != nil {
				return nil, fmt.Errorf("%s line %d: %w", path, i+1, err)
			}
		}
		s := sample{
			T: int(v[0]), Placed: v[4], Throughput: v[1] / float64(max(int(v[0])-lastT, 1)), P50: v[2], P99: v[3],
			Size: v[5] / 1e6, DeadIn: int64(v[6]), DeadOut: int64(v[7]),
			CleanupMax: v[8], HeldMax: v[9], WaitMax: v[10], Load: v[12],
		}
		if lastWAL > 0 && v[4] > 0 {
			s.WALPer = (v[11] - lastWAL) / v[4]
		}
		lastWAL, lastT = v[11], int(v[0])
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no samples", path)
	}
	return out, nil
}

func print(w io.Writer, title string, ss []sample) {
	fmt.Fprintf(w, "\n%s\n%6s %9s %7s %7s %9s %9s %9s %11s %8s %8s %10s %5s\n", title,
		"min", "orders/s", "p50 ms", "p99 ms", "size MB", "dead in", "dead out",
		"cleanup ms", "held ms", "wait ms", "WAL/order", "load")
	for _, s := range ss {
		fmt.Fprintf(w, "%6.1f %9.1f %7.0f %7.0f %9.1f %9d %9d %11.0f %8.0f %8.0f %10.0f %5.1f\n",
			float64(s.T)/60, s.Throughput, s.P50, s.P99, s.Size, s.DeadIn, s.DeadOut,
			s.CleanupMax, s.HeldMax, s.WaitMax, s.WALPer, s.Load)
	}
}

// judge prints the targets of the issue, each met or missed.
func judge(w io.Writer, old, part []sample, settle int) {
	// From settle on, while loadgen placed orders: the last sample, which
	// bench/soak.sh takes after loadgen stopped, holds the end of it.
	after := func(ss []sample) []sample {
		var out []sample
		for _, s := range ss[:len(ss)-1] {
			if s.T >= settle {
				out = append(out, s)
			}
		}
		return out
	}
	po, pp := after(old), after(part)
	fmt.Fprintf(w, "\nfrom minute %.0f on (retention reached):\n", float64(settle)/60)
	if len(pp) == 0 || len(po) == 0 {
		fmt.Fprintln(w, "  too short a run to judge")
		return
	}
	sizeSpread := spread(pp, func(s sample) float64 { return s.Size })
	p99Spread := spread(pp, func(s sample) float64 { return s.P99 })
	p99Old := spread(po, func(s sample) float64 { return s.P99 })
	check(w, fmt.Sprintf("partitioned size flat within ±10%%: %+.1f%%/%+.1f%% around its mean", sizeSpread[0], sizeSpread[1]),
		sizeSpread[0] >= -10 && sizeSpread[1] <= 10)
	// The row-deleting variant's spread, on the same machine at the same
	// minutes, tells the machine's noise from the partitions'.
	check(w, fmt.Sprintf("partitioned p99 flat within ±10%%: %+.1f%%/%+.1f%% around its mean (row-deleting: %+.1f%%/%+.1f%%)",
		p99Spread[0], p99Spread[1], p99Old[0], p99Old[1]),
		p99Spread[0] >= -10 && p99Spread[1] <= 10)
	for _, d := range []struct {
		table string
		f     func(sample) float64
	}{
		{"inbox", func(s sample) float64 { return float64(s.DeadIn) }},
		{"outbox", func(s sample) float64 { return float64(s.DeadOut) }},
	} {
		deadMax := maxOf(pp, d.f)
		check(w, fmt.Sprintf("partitioned %s dead tuples at most %.0f, near zero (row-deleting: up to %.0f)", d.table, deadMax,
			maxOf(po, d.f)), deadMax < 1000)
	}
	walOld, walNew := mean(po, func(s sample) float64 { return s.WALPer }), mean(pp, func(s sample) float64 { return s.WALPer })
	check(w, fmt.Sprintf("WAL per order %.0f B partitioned against %.0f B row-deleting (%.2fx)", walNew, walOld, walNew/walOld), walNew < walOld)
	held := maxOf(pp, func(s sample) float64 { return s.HeldMax })
	waited := maxOf(pp, func(s sample) float64 { return s.WaitMax })
	check(w, fmt.Sprintf("longest cleanup lock %.0f ms held, %.0f ms the longest a writer waited for a table lock "+
		"(row-deleting: %.0f ms); longest cleanup statement, its lock waits included, %.0f ms (row-deleting: %.0f ms)",
		held, waited, maxOf(po, func(s sample) float64 { return s.WaitMax }),
		maxOf(pp, func(s sample) float64 { return s.CleanupMax }), maxOf(po, func(s sample) float64 { return s.CleanupMax })),
		held <= 100 && waited <= 100)
	startOld, endNew := old[0].Throughput, mean(pp, func(s sample) float64 { return s.Throughput })
	if len(old) > 1 {
		startOld = old[1].Throughput // the first sample holds loadgen's start
	}
	check(w, fmt.Sprintf("partitioned throughput %.1f/s once retention is reached, %.2fx the row-deleting one's at the start (%.1f/s)",
		endNew, endNew/startOld, startOld), endNew >= 0.9*startOld)
}

func check(w io.Writer, what string, ok bool) {
	mark := "met   "
	if !ok {
		mark = "MISSED"
	}
	fmt.Fprintf(w, "  %s %s\n", mark, what)
}

// spread is the lowest and highest of f over ss, in percent of its mean.
func spread(ss []sample, f func(sample) float64) [2]float64 {
	m := mean(ss, f)
	lo, hi := f(ss[0]), f(ss[0])
	for _, s := range ss {
		lo, hi = min(lo, f(s)), max(hi, f(s))
	}
	if m == 0 {
		return [2]float64{}
	}
	return [2]float64{(lo - m) / m * 100, (hi - m) / m * 100}
}

func mean(ss []sample, f func(sample) float64) float64 {
	var sum float64
	for _, s := range ss {
		sum += f(s)
	}
	return sum / float64(len(ss))
}

func maxOf(ss []sample, f func(sample) float64) float64 {
	var m float64
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

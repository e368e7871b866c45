package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReportTakesMediansTheCoresCapAndTheSelfShare(t *testing.T) {
	in := strings.Join([]string{
		"BenchmarkInventory/pg=durable/mode=setbased-2   20000   99402 ns/op   120.0 cpu-us/event   10000 events/s   0.40 self-share",
		"BenchmarkInventory/pg=durable/mode=setbased-2   20000   99402 ns/op   100.0 cpu-us/event   12000 events/s   0.50 self-share",
		"BenchmarkInventory/pg=durable/mode=setbased-2   20000   99402 ns/op   80.0 cpu-us/event   11000 events/s   0.45 self-share",
		"BenchmarkBroker/op=publish/fsync=default-2   20000   20215 ns/op   50000 events/s",
	}, "\n")
	var out strings.Builder
	require.NoError(t, run(strings.NewReader(in), &out))

	ceiling := fmt.Sprintf("%.0f", float64(runtime.NumCPU())*1e6/100)
	require.Regexp(t, `Inventory/pg=durable/mode=setbased\s+11000\s+100\.0\s+`+ceiling+`\s+45 %\s+10000 12000 11000`, out.String())
	require.Regexp(t, `Broker/op=publish/fsync=default\s+50000\s+50000`, out.String(), "no CPU figure, no cap, no share")
	require.Regexp(t, `inventory set-based, events/s\s+11000 ≥\s+20000\s+MISSED`, out.String())
}

// TestRatiosArePairedByRound: a ratio is the median of the rounds' ratios,
// each of two figures of one round, not the ratio of the two medians, which
// would pair a fast round's figure with a slow round's.
func TestRatiosArePairedByRound(t *testing.T) {
	inbox := "BenchmarkInbox/pg=durable/mode=batched/workers=1-2   5000   1 ns/op   %d events/s"
	limit := "BenchmarkDBLimit/pg=durable/mode=batch/conns=1-2   5000   1 ns/op   %d events/s"
	// Medians: inbox 20,000, limit 40,000, 0.50× the limit. Round by round:
	// 0.80×, 0.40× and 0.80×.
	rounds := [][2]int{{20_000, 25_000}, {16_000, 40_000}, {40_000, 50_000}}
	tests := []struct {
		name  string
		lines func(round int, inbox, limit string) []string
	}{
		{"marked rounds, in any order within one", func(r int, inbox, limit string) []string {
			return []string{fmt.Sprintf("# round %d", r), limit, "PASS", inbox}
		}},
		{"unmarked: the k-th result is of round k", func(_ int, inbox, limit string) []string {
			return []string{inbox, limit}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []string
			for i, r := range rounds {
				in = append(in, tt.lines(i+1, fmt.Sprintf(inbox, r[0]), fmt.Sprintf(limit, r[1]))...)
			}
			var out strings.Builder
			require.NoError(t, run(strings.NewReader(strings.Join(in, "\n")), &out))
			require.Regexp(t, `batched inbox / batched DB limit \(its statements\)\s+0\.80× ≥\s+0\.60×\s+met\s+0\.80× 0\.40× 0\.80×`, out.String())
		})
	}
}

// TestRoundsPairOnlyTheirOwnFigures: a round that lost one figure of a
// ratio (a benchmark that failed) is left out of it rather than paired
// with another round's figure, and the results of one benchmark within a
// round pair in order.
func TestRoundsPairOnlyTheirOwnFigures(t *testing.T) {
	const (
		inbox = "BenchmarkInbox/pg=durable/mode=batched/workers=1-2   5000   1 ns/op   %d events/s"
		limit = "BenchmarkDBLimit/pg=durable/mode=batch/conns=1-2   5000   1 ns/op   %d events/s"
		ratio = `batched inbox / batched DB limit \(its statements\)`
	)
	tests := []struct {
		name  string
		lines []string
		want  string // "" for no ratio at all
	}{
		{"a round without its inbox figure", []string{
			"# round 1", fmt.Sprintf(inbox, 30_000), fmt.Sprintf(limit, 40_000),
			"# round 2", fmt.Sprintf(limit, 10_000),
		}, ratio + `\s+0\.75× ≥\s+0\.60×\s+met\s+0\.75×\n`},
		{"three results of each in one round", []string{
			"# round 1",
			fmt.Sprintf(inbox, 30_000), fmt.Sprintf(limit, 40_000),
			fmt.Sprintf(inbox, 28_000), fmt.Sprintf(limit, 40_000),
			fmt.Sprintf(inbox, 32_000), fmt.Sprintf(limit, 40_000),
		}, ratio + `\s+0\.75× ≥\s+0\.60×\s+met\s+0\.75× 0\.70× 0\.80×\n`},
		{"no round with both figures", []string{
			"# round 1", fmt.Sprintf(inbox, 30_000),
			"# round 2", fmt.Sprintf(limit, 40_000),
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			require.NoError(t, run(strings.NewReader(strings.Join(tt.lines, "\n")), &out))
			if tt.want == "" {
				require.NotRegexp(t, ratio, out.String())
				return
			}
			require.Regexp(t, tt.want, out.String())
		})
	}
}

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

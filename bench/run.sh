#!/usr/bin/env bash
# Runs every benchmark of ./bench side by side in one go and prints the
# figures and the ratios against the project's targets (bench/report).
#
#   bench/run.sh                      # all benchmarks, 3 runs each
#   BENCH=Inbox COUNT=1 bench/run.sh  # a subset
#
# BENCH       -bench regexp (default: all)
# COUNT       rounds, each running every benchmark once; the report takes
#             the median of the rounds' figures, and of their ratios
#             (default 3)
# EVENTS      events per benchmark run, a fixed count so that every figure
#             covers the same work (default 5000)
# BACKLOG     outbox rows the relay and the Watermill forwarder drain
#             (default 50000). A drain of 5,000 rows lasts a tenth of a
#             second for the relay and measures its start; Watermill slows
#             as its table grows. Both figures depend on it (see
#             docs/performance.md).
# OUT         where the raw `go test` output is kept (default bench/out.txt)
set -euo pipefail
cd "$(dirname "$0")/.."

bench=${BENCH:-.}
count=${COUNT:-3}
events=${EVENTS:-5000}
backlog=${BACKLOG:-50000}
out=${OUT:-bench/out.txt}
drains='Relay|Watermill'
# The drains among the selected benchmarks, run with their own count.
selected_drains=$(go test -list "${bench%%/*}" ./bench | grep -E "^Benchmark($drains)\$" | paste -sd'|' || true)

echo "hardware: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "postgres: $(postgres --version 2>/dev/null || echo unknown); go: $(go env GOVERSION)"
echo "running: go test -run '^\$' -bench '$bench' -skip '$drains' -benchtime ${events}x -count $count -timeout 0 ./bench"
[ -z "$selected_drains" ] || echo "and:     go test -run '^\$' -bench '^($selected_drains)\$' -benchtime ${backlog}x -count $count -timeout 0 ./bench"
# Rounds instead of -count, so that load that comes and goes on the machine
# falls on every benchmark alike rather than on a few.
: >"$out"
for round in $(seq "$count"); do
	echo "round $round of $count"
	echo "# round $round" >>"$out" # bench/report pairs the figures of a ratio by round
	go test -run '^$' -bench "$bench" -skip "$drains" -benchtime "${events}x" -count 1 -timeout 0 ./bench 2>/dev/null |
		tee -a "$out" | grep -E '^Benchmark' || true
	[ -z "$selected_drains" ] ||
		go test -run '^$' -bench "^($selected_drains)\$" -benchtime "${backlog}x" -count 1 -timeout 0 ./bench 2>/dev/null |
		tee -a "$out" | grep -E '^Benchmark' || true
done
echo
go run ./bench/report <"$out"

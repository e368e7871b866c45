#!/usr/bin/env bash
# Compares two builds of onceflow end to end, in turn: each run starts a
# fresh `onceflow dev`, drives it with the same build's loadgen, prints the
# finished rate and the latency, and stops it. Runs alternate (A B A B …)
# so that the machine's drift between hours falls on both alike.
#
#   go build -o /tmp/a ./cmd/onceflow   # on the old commit
#   go build -o /tmp/b ./cmd/onceflow   # on the new one
#   bench/ab.sh /tmp/a /tmp/b
#   RATE=300/s ROUNDS=3 bench/ab.sh /tmp/a /tmp/b
#
# RATE       loadgen's rate, 0 for as fast as possible (default 0)
# DURATION   how long each run places orders (default 40s)
# ROUNDS     pairs of runs (default 2)
# DEVFLAGS   extra flags of `onceflow dev`, e.g. --durable
#
# A run that fails (dev never ready, loadgen exiting non-zero or printing
# no result) prints FAILED with the tail of its output, the other runs go
# on, and the script exits 1 at the end.
set -euo pipefail
# onceflow dev's issuer gives loadgen an operator's token (to seed) for
# this secret; both read it from the environment.
ISSUER_OPERATOR_SECRET=${ISSUER_OPERATOR_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export ISSUER_OPERATOR_SECRET
[ $# -eq 2 ] || { echo "usage: $0 OLD-BINARY NEW-BINARY" >&2; exit 2; }
rate=${RATE:-0}
duration=${DURATION:-40s}
rounds=${ROUNDS:-2}

failed=0
run() {
	local bin=$1 dev log
	log=$(mktemp)
	# shellcheck disable=SC2086 # DEVFLAGS is a list of flags
	LOG_LEVEL=warn "$bin" dev --http-port 18080 --nats-port 14222 --pg-port 15432 ${DEVFLAGS:-} >"$log.dev" 2>&1 &
	dev=$!
	# Builds since the HTTP tokens take them from dev's issuer. Read the
	# help whole first: under pipefail, grep -q closing the pipe early
	# fails the test with loadgen's SIGPIPE whenever it matched.
	local help wants_issuer=0
	help=$("$bin" loadgen -h 2>&1 || true)
	grep -q -- -issuer-url <<<"$help" && wants_issuer=1
	# The issuer's URL is the one this dev printed once it was up (its
	# "issuer" line), never a default: loadgen's own is 127.0.0.1:8084,
	# another dev's or nobody's.
	local ready=0 issuer_url=""
	for _ in $(seq 240); do
		issuer_url=$(awk '$1 == "issuer" { print $2; exit }' "$log.dev")
		if [ "$wants_issuer" = 0 ] || [ -n "$issuer_url" ]; then
			"$bin" healthcheck http://127.0.0.1:18083/readyz >/dev/null 2>&1 && { ready=1; break; }
		fi
		sleep 0.5
	done
	local issuer=() status=0
	[ "$wants_issuer" = 1 ] && issuer=(--issuer-url "$issuer_url")
	if [ "$ready" = 1 ]; then
		"$bin" loadgen --rate "$rate" --duration "$duration" --customers 200 --skus 200 \
			--order-url http://127.0.0.1:18080 --payment-url http://127.0.0.1:18081 --inventory-url http://127.0.0.1:18082 "${issuer[@]}" >"$log" 2>&1 || status=$?
	fi
	if [ "$ready" = 0 ]; then
		failed=1
		echo "  FAILED: dev was not ready, or printed no issuer, within 2 minutes; its last lines:"
		tail -5 "$log.dev" | sed 's/^/    /'
	elif [ "$status" = 0 ] && grep -q '^  finished' "$log"; then
		grep -E '^  (finished|placed→confirmed)' "$log"
	else
		failed=1
		echo "  FAILED: loadgen exited $status; its last lines, then dev's:"
		tail -5 "$log" | sed 's/^/    /'
		tail -5 "$log.dev" | sed 's/^/    /'
	fi
	kill -INT "$dev" 2>/dev/null || true
	wait "$dev" || true
	rm -f "$log" "$log.dev"
}

old=$1 new=$2
for round in $(seq "$rounds"); do
	echo "== round $round, A: $old"
	run "$old"
	echo "== round $round, B: $new"
	run "$new"
done
if [ "$failed" = 1 ]; then
	echo "ab: a run failed (FAILED above); its figures are missing" >&2
	exit 1
fi

#!/usr/bin/env bash
# End to end: `onceflow dev` driven by `onceflow loadgen` over HTTP, once as
# fast as the clients can (throughput) and once at a fixed rate (latency),
# for each fsync setting, all in one run so that the figures compare.
#
#   bench/e2e.sh                          # both settings, 1 minute each
#   SYNC=interval DURATION=20s bench/e2e.sh
#
# SYNC       fsync settings to run (default "interval durable"): interval is
#            dev's default (PostgreSQL without fsync, JetStream's default
#            sync interval); durable is `dev --durable` (PostgreSQL's
#            defaults, JetStream sync_interval: always), the honest headline
# DURATION   how long each loadgen run places orders (default 1m)
# RATE       the fixed rate of the latency run (default 300/s)
# OUT        where the JSON results and histograms go (default bench/e2e-out)
# CUSTOMERS, SKUS   seeded by loadgen (default 200 each: enough that wallets
#            and stock rows are not a handful of hot rows, and that a
#            backlog stays within the order lists loadgen follows)
# Extra environment (CONSUMER_WORKERS, MAX_ORDERS_IN_FLIGHT, …) reaches the
# services through dev. Each run prints how busy the machine was and the
# CPU that onceflow dev, its PostgreSQL and loadgen took. After each
# fixed-rate run, bench/hops breaks its latency down by hop of the saga,
# from the services' databases.
set -euo pipefail
# onceflow dev's issuer gives loadgen an operator's token (to seed) for
# this secret; both read it from the environment.
ISSUER_OPERATOR_SECRET=${ISSUER_OPERATOR_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export ISSUER_OPERATOR_SECRET
cd "$(dirname "$0")/.."

syncs=${SYNC:-interval durable}
duration=${DURATION:-1m}
rate=${RATE:-300/s}
out=${OUT:-bench/e2e-out}
customers=${CUSTOMERS:-200}
skus=${SKUS:-200}
mkdir -p "$out"
tmp=$(mktemp -d)
bin=$tmp/onceflow
trap 'kill "${dev:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT

# cpu_jiffies prints the machine's busy and total CPU time so far. Busy is
# neither idle, nor waiting for I/O, nor stolen by the hypervisor.
cpu_jiffies() { awk '/^cpu / {print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
# dev_ticks prints the CPU time so far (clock ticks) of onceflow dev's own
# process and of its PostgreSQL: the postmaster (a child of dev, whose
# exited children count in its own figure) and its live children.
dev_ticks() {
	local pg=0 p postmaster
	postmaster=$(pgrep -P "$dev" -x postgres || true)
	for p in $postmaster $([[ -z $postmaster ]] || pgrep -P "$postmaster"); do
		pg=$((pg + $(awk '{print $14+$15+$16+$17}' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$(awk '{print $14+$15}' "/proc/$dev/stat") $pg"
}
# times_ticks prints the CPU time of a shell's finished children from the
# output of `times` in file $1 (written by the shell itself: `times` in a
# subshell would report the subshell's).
times_ticks() { awk -v hz="$(getconf CLK_TCK)" 'NR == 2 {
	split($1, u, /[ms]/); split($2, s, /[ms]/); print int((u[1] * 60 + u[2] + s[1] * 60 + s[2]) * hz) }' "$1"; }

echo "hardware: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
go build -o "$bin" ./cmd/onceflow
go build -o "$tmp/hops" ./bench/hops

# A fresh `onceflow dev` for every run, so that no run inherits the backlog
# of the one before.
for sync in $syncs; do
	flags=(--http-port 18080 --nats-port 14222 --pg-port 15432)
	if [[ $sync == durable ]]; then
		flags+=(--durable)
	else
		flags+=(--nats-sync interval)
	fi
	for run in "max:0" "fixed:$rate"; do
		name=${run%%:*} r=${run#*:}
		LOG_LEVEL=warn "$bin" dev "${flags[@]}" >"$out/dev-$sync-$name.log" 2>&1 &
		dev=$!
		for _ in $(seq 120); do
			"$bin" healthcheck http://127.0.0.1:18083/readyz >/dev/null 2>&1 && break
			sleep 0.5
		done
		urls=(--order-url http://127.0.0.1:18080 --payment-url http://127.0.0.1:18081 --inventory-url http://127.0.0.1:18082 --issuer-url http://127.0.0.1:18084)
		echo
		echo "== $sync, rate ${r/#0/as fast as possible}, $duration"
		echo "   onceflow loadgen --rate $r --duration $duration --customers $customers --skus $skus"
		# A run that leaves orders unfinished exits non-zero; its figures
		# are printed all the same, and the next run goes on.
		cpu0=($(cpu_jiffies)) dev0=($(dev_ticks)) t0=$SECONDS
		times >"$tmp/times0"
		"$bin" loadgen --rate "$r" --duration "$duration" --customers "$customers" --skus "$skus" "${urls[@]}" \
			--json "$out/$sync-$name.json" --histogram "$out/$sync-$name.svg" 2>/dev/null || true
		times >"$tmp/times1"
		cpu1=($(cpu_jiffies)) dev1=($(dev_ticks)) t1=$SECONDS
		lg0=$(times_ticks "$tmp/times0") lg1=$(times_ticks "$tmp/times1")
		echo "  machine busy $((100 * (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1])))% of $(nproc) cores while loadgen ran (loadgen included)"
		# Shares of one core: what the services, their databases and the
		# load generator itself cost.
		ticks=$(($(getconf CLK_TCK) * (t1 - t0 > 0 ? t1 - t0 : 1)))
		echo "  of one core: onceflow dev $((100 * (dev1[0] - dev0[0]) / ticks))%, its PostgreSQL $((100 * (dev1[1] - dev0[1]) / ticks))%, loadgen $((100 * (lg1 - lg0) / ticks))%"
		if [[ $name == fixed ]]; then
			db=postgres://postgres@127.0.0.1:15432
			"$tmp/hops" -order "$db/onceflow_order" -payment "$db/onceflow_payment" -inventory "$db/onceflow_inventory" || true
		fi
		kill -INT "$dev"
		wait "$dev" || true
		dev=
	done
done

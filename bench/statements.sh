#!/usr/bin/env bash
# Where PostgreSQL's time goes at a fixed rate: starts a throwaway cluster
# with pg_stat_statements (and track_planning), runs `onceflow dev` on it,
# drives it with `onceflow loadgen`, and prints, for a window in the middle
# of the run, the statement time spent executing and planning, the time per
# database, and the statements that took the most, with their plans.
#
#   bench/statements.sh
#   RATE=150/s bench/statements.sh
#
# RATE       loadgen's rate (default 300/s)
# DURATION   how long loadgen places orders (default 30s)
# WINDOW     the seconds measured, after half of the rest (default 12)
# TOP        statements listed (default 15)
# PORT       the cluster's port (default 15433)
# BIN        an onceflow binary to measure instead of building this tree's
#
# PostgreSQL refuses to run as root: as root, the cluster runs as the
# postgres user. The cluster keeps PostgreSQL's defaults (fsync on).
set -euo pipefail
# onceflow dev's issuer gives loadgen an operator's token (to seed) for
# this secret; both read it from the environment.
ISSUER_OPERATOR_SECRET=${ISSUER_OPERATOR_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export ISSUER_OPERATOR_SECRET
cd "$(dirname "$0")/.."

rate=${RATE:-300/s}
duration=${DURATION:-30s}
window=${WINDOW:-12}
top=${TOP:-15}
port=${PORT:-15433}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bindir/initdb" ] || { echo "no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }

dir=$(mktemp -d /tmp/onceflow-statements.XXXXXX)
bin=${BIN:-$dir/onceflow}
[ -n "${BIN:-}" ] || go build -o "$bin" ./cmd/onceflow
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
as_pg "'$bindir/initdb' -D '$dir/data' -U postgres -A trust >/dev/null"
as_pg "'$bindir/pg_ctl' -D '$dir/data' -l '$dir/pg.log' -w -o \"-p $port -k '$dir' -c listen_addresses=127.0.0.1 -c max_connections=200 -c autovacuum_naptime=10s -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on\" start >/dev/null"
psql="psql -h 127.0.0.1 -p $port -U postgres -d postgres -qAt"
dev=
cleanup() {
	[ -z "$dev" ] || { kill -INT "$dev" 2>/dev/null; wait "$dev" 2>/dev/null || true; }
	as_pg "'$bindir/pg_ctl' -D '$dir/data' -m fast stop >/dev/null" || true
	rm -rf "$dir"
}
trap cleanup EXIT
$psql -c "CREATE EXTENSION pg_stat_statements"

DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres" LOG_LEVEL=warn \
	"$bin" dev --http-port 18080 --nats-port 14222 >"$dir/dev.log" 2>&1 &
dev=$!
for _ in $(seq 240); do
	"$bin" healthcheck http://127.0.0.1:18083/readyz >/dev/null 2>&1 && break
	sleep 0.5
done
"$bin" healthcheck http://127.0.0.1:18083/readyz >/dev/null

secs=${duration%s}
start=$(( (secs - window) / 2 ))
(
	sleep "$start"
	$psql -c "SELECT pg_stat_statements_reset()" >/dev/null
	sleep "$window"
	$psql -c "\copy (SELECT * FROM pg_stat_statements) TO '$dir/window.csv' CSV"
	$psql -c "CREATE TABLE IF NOT EXISTS window_stats (LIKE pg_stat_statements)" \
		-c "TRUNCATE window_stats" -c "\copy window_stats FROM '$dir/window.csv' CSV"
) &
window_job=$!
echo "running: onceflow loadgen --rate $rate --duration $duration; window: ${window}s from ${start}s"
"$bin" loadgen --rate "$rate" --duration "$duration" --customers 200 --skus 200 \
	--order-url http://127.0.0.1:18080 --payment-url http://127.0.0.1:18081 --inventory-url http://127.0.0.1:18082 \
	--issuer-url http://127.0.0.1:18084 2>/dev/null |
	grep -E 'placed |finished|placed→confirmed' || true
wait "$window_job"

echo
echo "statement time in the window (ms):"
$psql -F ' ' -c "SELECT 'executing', round(sum(total_exec_time)::numeric), 'planning', round(sum(total_plan_time)::numeric),
	'planning share', round((100 * sum(total_plan_time) / nullif(sum(total_exec_time + total_plan_time), 0))::numeric, 1) || ' %',
	'calls', sum(calls) FROM window_stats"
echo
echo "per database (ms):"
$psql -F ' ' -c "SELECT rpad(d.datname, 20), round(sum(s.total_exec_time + s.total_plan_time)::numeric)
	FROM window_stats s JOIN pg_database d ON d.oid = s.dbid GROUP BY 1 ORDER BY 2 DESC"
echo
echo "top $top statements: database | calls | plans | exec ms | plan ms | query"
$psql -c "SELECT d.datname, s.calls, s.plans, round(s.total_exec_time::numeric), round(s.total_plan_time::numeric),
	left(regexp_replace(s.query, '\s+', ' ', 'g'), 60)
	FROM window_stats s JOIN pg_database d ON d.oid = s.dbid
	ORDER BY s.total_exec_time + s.total_plan_time DESC LIMIT $top"

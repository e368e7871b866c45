#!/usr/bin/env bash
# Time-compressed soak of retention, side by side: the row-deleting
# cleaners of the release before partitioning (OLD) against this tree's
# partitioned inbox and outbox, in one run, both at once, each on its own
# PostgreSQL cluster (with pg_stat_statements), its own `onceflow dev
# --durable` and its own loadgen at a fixed rate. Retention is minutes and
# partitions seconds, so that dozens of partition cycles pass in the run.
# Every SAMPLE seconds it records, per variant: the saga's throughput
# (orders confirmed), placed→confirmed p50/p99 (orders.created_at to the
# confirming update, the order service's clock), the inbox and outbox
# tables' total size (heap, indexes, TOAST, every partition, all four
# databases), the dead tuples of each (n_dead_tup, summed over the tables
# or partitions alive at the sample), WAL bytes per order placed, the
# cleanup's longest statement (pg_stat_statements' max_exec_time of the
# DELETEs, or of partition_create/partition_drop, their lock waits
# included), the longest a partition step held its lock (the server log:
# partition_create/partition_drop log it), the longest any other session
# waited for a lock on a table (log_lock_waits with a 10 ms
# deadlock_timeout: a writer kept waiting behind the cleanup), and the
# machine's load average. At the end it breaks down the WAL of the second
# half of the run by record type (pg_waldump --stats=record) into OUT,
# and keeps the servers' logs there (pg-old.log.gz, pg-new.log.gz). Then it
# prints both tables and draws size and p99 over the run
# (bench/soak/main.go).
#
#   bench/soak.sh
#   RATE=50/s DURATION=15m bench/soak.sh
#
# RATE        loadgen's rate, per variant (default 50/s: at 20/s a 10 s
#             partition holds 200 orders, so few that making and dropping
#             it costs as much WAL per order as deleting them; 100/s per
#             variant saturated a 2-core machine)
# DURATION    how long loadgen places orders (default 15m)
# SAMPLE      seconds between samples (default 60)
# OLD         the old revision (default: the parent of the commit that
#             partitioned the tables)
# OUT         where the CSVs and the plot go (default bench/soak-out)
#
# The old release's own inbox cleaner runs hourly with an hour's margin
# (neither was a setting), so this script runs its DELETE, verbatim, every
# 10 seconds with the margin the partitioned inbox uses (a tenth of the
# retention); its outbox cleaner is its own (every minute, OUTBOX_RETENTION).
set -euo pipefail
cd "$(dirname "$0")/.."

rate=${RATE:-50/s}
duration=${DURATION:-15m}
sample=${SAMPLE:-60}
out=${OUT:-bench/soak-out}
old=${OLD:-$(git log --format=%H -1 --diff-filter=A -- db/migrations/platform/00009_processed_events_partitioned.sql)^}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bindir/initdb" ] || { echo "no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }

# onceflow dev's issuer gives loadgen an operator's token (to seed) for
# this secret; both read it from the environment.
ISSUER_OPERATOR_SECRET=${ISSUER_OPERATOR_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export ISSUER_OPERATOR_SECRET

# The compressed settings, the same for both variants.
export INBOX_RETENTION=3m OUTBOX_RETENTION=2m STREAM_DUPLICATE_WINDOW=1m
export INBOX_PARTITION_INTERVAL=10s OUTBOX_PARTITION_INTERVAL=10s INBOX_MAX_SKEW=20s
inbox_cut="3 minutes 18 seconds" # retention plus a tenth

mkdir -p "$out"
dir=$(mktemp -d /tmp/onceflow-soak.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
pids=()
cleanup() {
	# INT stops `onceflow dev` cleanly; the script's own loops, background
	# jobs of a non-interactive shell, ignore it and take TERM.
	for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for v in old new; do
		[ -f "$dir/$v/pg.log" ] && gzip -c "$dir/$v/pg.log" >"$out/pg-$v.log.gz"
		[ -d "$dir/$v/data" ] && as_pg "'$bindir/pg_ctl' -D '$dir/$v/data' -m fast stop >/dev/null" || true
	done
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$dir/src" && git archive "$old" | tar -x -C "$dir/src"
(cd "$dir/src" && go build -o "$dir/onceflow-old" ./cmd/onceflow)
go build -o "$dir/onceflow-new" ./cmd/onceflow

# variant NAME BINARY PGPORT HTTPPORT NATSPORT
variant() {
	local v=$1 bin=$2 port=$3 http=$4 nats=$5
	mkdir -p "$dir/$v" && [ "$(id -u)" = 0 ] && chown postgres "$dir/$v"
	as_pg "'$bindir/initdb' -D '$dir/$v/data' -U postgres -A trust >/dev/null"
	as_pg "'$bindir/pg_ctl' -D '$dir/$v/data' -l '$dir/$v/pg.log' -w -o \"-p $port -k '$dir/$v' -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_preload_libraries=pg_stat_statements -c log_lock_waits=on -c deadlock_timeout=10ms -c wal_keep_size=16GB\" start >/dev/null"
	psql -h 127.0.0.1 -p "$port" -U postgres -qAt -c "CREATE EXTENSION pg_stat_statements"
	DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres" LOG_LEVEL=warn \
		"$bin" dev --durable --http-port "$http" --nats-port "$nats" --console-port -1 >"$dir/$v/dev.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 240); do
		"$bin" healthcheck "http://127.0.0.1:$((http + 3))/readyz" >/dev/null 2>&1 && break
		sleep 0.5
	done
	"$bin" healthcheck "http://127.0.0.1:$((http + 3))/readyz" >/dev/null
}

variant old "$dir/onceflow-old" 15441 18180 14241
variant new "$dir/onceflow-new" 15442 18280 14242

declare -A lsn_half
port_of() { if [ "$1" = old ]; then echo 15441; else echo 15442; fi; }
dbs="onceflow_order onceflow_payment onceflow_inventory onceflow_notify"
q() { psql -h 127.0.0.1 -p "$1" -U postgres -d "$2" -qAt -F, -c "$3"; }

# The old inbox cleaner's statement (db/queries/inbox DeleteMintedBefore
# of $old), compressed: every 10 seconds, batches of 10,000, until fewer.
old_inbox_cleaner() {
	while :; do
		for d in $dbs; do
			while :; do
				n=$(q 15441 "$d" "WITH d AS (DELETE FROM processed_events WHERE ctid = ANY (ARRAY(
					SELECT p.ctid FROM processed_events p
					WHERE p.event_id < (lpad(to_hex((extract(epoch FROM now() - interval '$inbox_cut') * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid
					ORDER BY p.event_id LIMIT 10000)) RETURNING 1) SELECT count(*) FROM d")
				[ "${n:-0}" -lt 10000 ] && break
			done
		done
		sleep 10
	done
}
old_inbox_cleaner >/dev/null 2>&1 &
pids+=($!)

# logmax VARIANT REGEXP: the largest "N ms" of the lines of the variant's
# server log that match REGEXP, among those written since the last call.
logmax() {
	local log=$dir/$1/pg.log off=0 end
	[ -f "$dir/$1/$2.off" ] && off=$(cat "$dir/$1/$2.off")
	end=$(stat -c %s "$log")
	echo "$end" >"$dir/$1/$2.off"
	tail -c +$((off + 1)) "$log" | head -c $((end - off)) | grep -E "$3" |
		sed -nE 's/.* ([0-9]+(\.[0-9]+)?) ms.*/\1/p' | sort -g | tail -1 | awk '{ printf "%d", $1 + 0.5 } END { if (NR == 0) printf "0" }'
}

# sample VARIANT PORT: one CSV line of the time since the variant's last
# sample (a sample takes seconds on a busy machine: SAMPLE apart, the
# samples' windows would leave orders out).
sample() {
	local v=$1 port=$2 placed=0 size=0 dead_in=0 dead_out=0 lock=0 lat since until
	since=$(cat "$dir/$v/since" 2>/dev/null || q "$port" postgres "SELECT now() - interval '$sample seconds'")
	until=$(q "$port" postgres "SELECT now()")
	echo "$until" >"$dir/$v/since"
	lat=$(q "$port" onceflow_order "SELECT count(*),
		coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at) * 1000), 0)::int,
		coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at) * 1000), 0)::int
		FROM orders WHERE status = 'CONFIRMED' AND updated_at >= '$since' AND updated_at < '$until'")
	placed=$(q "$port" onceflow_order "SELECT count(*) FROM orders WHERE created_at >= '$since' AND created_at < '$until'")
	for d in $dbs; do
		# Every table that holds rows (relkind r): the plain tables of the
		# old release, the partitions of the new.
		size=$((size + $(q "$port" "$d" "SELECT coalesce(sum(pg_total_relation_size(oid)), 0) FROM pg_class
			WHERE relkind = 'r' AND relname ~ '^(processed_events|outbox)(_|$)'")))
		dead_in=$((dead_in + $(q "$port" "$d" "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname ~ '^processed_events(_|$)'")))
		dead_out=$((dead_out + $(q "$port" "$d" "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname ~ '^outbox(_|$)'")))
	done
	lock=$(q "$port" postgres "SELECT coalesce(max(max_exec_time), 0)::int FROM pg_stat_statements
		WHERE query ~ 'DELETE FROM (outbox|processed_events)|partition_(create|drop)\('")
	q "$port" postgres "SELECT pg_stat_statements_reset(0, 0, queryid) FROM pg_stat_statements
		WHERE query ~ 'DELETE FROM (outbox|processed_events)|partition_(create|drop)\('" >/dev/null
	local wal held waited
	wal=$(q "$port" postgres "SELECT pg_current_wal_lsn() - '0/0'")
	held=$(logmax "$v" held 'partition_(create|drop) .* held')
	# Lock modes that the services' statements take, on tables (a wait
	# for a row, "on transaction", is another writer's, not the cleanup's).
	waited=$(logmax "$v" waited 'acquired (AccessShare|RowShare|RowExclusive)Lock on relation')
	echo "$lat,$placed,$size,$dead_in,$dead_out,$lock,$held,$waited,$wal,$(cut -d' ' -f1 /proc/loadavg)"
}

for v in old new; do
	echo "t_s,confirmed,p50_ms,p99_ms,placed,size_bytes,dead_inbox,dead_outbox,cleanup_max_ms,held_max_ms,writer_wait_max_ms,wal_lsn,load1" >"$out/$v.csv"
done
sampler() {
	local start=$SECONDS
	while :; do
		sleep "$sample"
		local t=$((SECONDS - start))
		echo "$t,$(sample old 15441)" >>"$out/old.csv"
		echo "$t,$(sample new 15442)" >>"$out/new.csv"
		[ -f "$dir/stop" ] && return
	done
}
sampler &
sampler_pid=$!
pids+=($sampler_pid)

loadgen() {
	local v=$1 http=$2
	"$dir/onceflow-$v" loadgen --rate "$rate" --duration "$duration" --customers 400 --skus 400 \
		--order-url "http://127.0.0.1:$http" --payment-url "http://127.0.0.1:$((http + 1))" \
		--inventory-url "http://127.0.0.1:$((http + 2))" --issuer-url "http://127.0.0.1:$((http + 4))" \
		>"$out/loadgen-$v.txt" 2>&1
}
uptime | tee "$out/uptime.txt"
loadgen old 18180 &
lg_old=$!
loadgen new 18280 &
lg_new=$!
# Half the duration (of the forms 15m, 900s): the WAL is broken down from
# there on, when retention has long been reached.
case $duration in *m) half=$((${duration%m} * 30)) ;; *s) half=$((${duration%s} / 2)) ;; *) half=60 ;; esac
sleep "$half"
uptime | tee -a "$out/uptime.txt"
for v in old new; do lsn_half[$v]=$(q "$(port_of $v)" postgres "SELECT pg_current_wal_lsn()"); done
failed=0
wait "$lg_old" || failed=1
wait "$lg_new" || failed=1
if [ "$failed" = 1 ]; then
	for v in old new; do echo "== loadgen $v:" >&2; tail -5 "$out/loadgen-$v.txt" >&2; done
	echo "soak: a loadgen failed, the samples are not worth judging" >&2
	exit 1
fi
uptime | tee -a "$out/uptime.txt"
for v in old new; do
	lsn=$(q "$(port_of $v)" postgres "SELECT pg_current_wal_lsn()")
	"$bindir/pg_waldump" --stats=record -p "$dir/$v/data/pg_wal" -s "${lsn_half[$v]}" -e "$lsn" >"$out/waldump-$v.txt" 2>&1 || true
done
# One more sample, of the in-flight orders' end, and the sampler stops.
touch "$dir/stop"
wait "$sampler_pid" || true
go run ./bench/soak -old "$out/old.csv" -new "$out/new.csv" -svg "$out/soak.svg"

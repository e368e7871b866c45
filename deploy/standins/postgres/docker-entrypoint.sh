#!/bin/sh
# The stand-in postgres image's entrypoint: the contract of the official
# image's docker-entrypoint.sh that onceflow relies on, in busybox sh.
#
#   POSTGRES_PASSWORD (required unless POSTGRES_HOST_AUTH_METHOD=trust),
#   POSTGRES_USER (postgres), POSTGRES_DB (POSTGRES_USER),
#   POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD (scram-sha-256), each
#   also as a *_FILE variable; PGDATA (/var/lib/postgresql/data).
#   On an empty PGDATA: initdb, then a server on the socket only runs
#   /docker-entrypoint-initdb.d/* in name order (*.sh executed if
#   executable, else sourced; *.sql and *.sql.gz through psql), once.
#   Arguments starting with "-" are postgres's; the server runs as the
#   postgres user (uid 70, as in the alpine image), listening on every
#   address (postgresql.conf's listen_addresses, as the image's sample).
set -e # not -u: init scripts are sourced, as by the official image

file_env() {
	var=$1
	def=${2:-}
	eval "val=\${$var:-}"
	eval "fileval=\${${var}_FILE:-}"
	if [ -n "$val" ] && [ -n "$fileval" ]; then
		echo "error: both $var and ${var}_FILE are set" >&2
		exit 1
	fi
	if [ -n "$fileval" ]; then
		val=$(cat "$fileval")
	fi
	[ -n "$val" ] || val=$def
	export "$var=$val"
	unset "${var}_FILE"
}

if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi

PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA"
	chown postgres:postgres "$PGDATA"
	chmod 700 "$PGDATA"
	mkdir -p /var/run/postgresql
	chown postgres:postgres /var/run/postgresql
	chmod 3777 /var/run/postgresql
	# busybox has no gosu or su-exec; its start-stop-daemon execs in place.
	exec start-stop-daemon --start --chuid postgres:postgres --exec "$0" -- "$@"
fi

file_env POSTGRES_PASSWORD
file_env POSTGRES_USER postgres
file_env POSTGRES_DB "$POSTGRES_USER"
file_env POSTGRES_INITDB_ARGS
POSTGRES_HOST_AUTH_METHOD=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		echo "error: database is uninitialized and superuser password is not specified." >&2
		echo "       Set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)." >&2
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 $POSTGRES_INITDB_ARGS
	rm -f "$pwfile"
	printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	# The init scripts run against a server on the socket only: nobody
	# reaches it over TCP (pg_isready -h 127.0.0.1 fails) until they are done.
	PGUSER=$POSTGRES_USER PGPASSWORD=$POSTGRES_PASSWORD \
		pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	export PGPASSWORD="$POSTGRES_PASSWORD"
	psql_init() { psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --no-password "$@"; }
	if [ "$POSTGRES_DB" != postgres ]; then
		psql_init --dbname postgres --set db="$POSTGRES_DB" <<-'SQL'
			CREATE DATABASE :"db";
		SQL
	fi
	for f in $(ls /docker-entrypoint-initdb.d/ 2>/dev/null | sort); do
		f=/docker-entrypoint-initdb.d/$f
		case "$f" in
		*.sh)
			if [ -x "$f" ]; then
				echo "$0: running $f"
				"$f"
			else
				echo "$0: sourcing $f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) echo "$0: running $f"; psql_init --dbname "$POSTGRES_DB" -f "$f" ;;
		*.sql.gz) echo "$0: running $f"; gunzip -c "$f" | psql_init --dbname "$POSTGRES_DB" ;;
		*) echo "$0: ignoring $f" ;;
		esac
	done
	unset PGPASSWORD
	pg_ctl -D "$PGDATA" -m fast -w stop
	echo
	echo "PostgreSQL init process complete; ready for start up."
	echo
fi

exec "$@"

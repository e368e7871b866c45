#!/bin/sh
# Creates the databases of onceflow's services, each owned by a role of its
# own that can connect to its own database and to no other.
#
# The postgres image runs this once, on an empty data directory, from
# /docker-entrypoint-initdb.d (docker-compose.yml mounts it there). Every
# <SERVICE>_DB_PASSWORD variable of the environment names a service and is
# its role's password (docker-compose.yml sets ORDER_DB_PASSWORD,
# PAYMENT_DB_PASSWORD, INVENTORY_DB_PASSWORD, NOTIFY_DB_PASSWORD and one per
# service added since); keep them free of characters that need escaping in a
# URL, since the services' DATABASE_URLs embed them.
set -e # not -u: the image sources the script when it is not executable

run_psql() {
	psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet \
		--username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" "$@"
}

services=$(env | sed -n 's/^\([A-Z][A-Z0-9_]*\)_DB_PASSWORD=.*/\1/p' | tr '[:upper:]' '[:lower:]' | sort)
if [ -z "$services" ]; then
	echo "init-databases.sh: no <SERVICE>_DB_PASSWORD variable set" >&2
	exit 1
fi
for service in $services; do
	password_var=$(printf '%s_DB_PASSWORD' "$service" | tr '[:lower:]' '[:upper:]')
	eval "password=\${$password_var}"
	# The owner may create in the public schema (PostgreSQL 15+: it belongs
	# to pg_database_owner); PUBLIC loses the default CONNECT and TEMP.
	run_psql -v name="onceflow_$service" -v password="$password" <<'SQL'
CREATE ROLE :"name" LOGIN PASSWORD :'password';
CREATE DATABASE :"name" OWNER :"name";
REVOKE ALL ON DATABASE :"name" FROM PUBLIC;
SQL
done

# Nor may the service roles connect to the maintenance databases.
run_psql -v maintenance="${POSTGRES_DB:-postgres}" <<'SQL'
REVOKE CONNECT ON DATABASE :"maintenance" FROM PUBLIC;
REVOKE CONNECT ON DATABASE template1 FROM PUBLIC;
SQL

#!/bin/sh
# Creates the databases of onceflow's four services, each owned by a role of
# its own that can connect to its own database and to no other.
#
# The postgres image runs this once, on an empty data directory, from
# /docker-entrypoint-initdb.d (docker-compose.yml mounts it there). The role
# passwords come from ORDER_DB_PASSWORD, PAYMENT_DB_PASSWORD,
# INVENTORY_DB_PASSWORD and NOTIFY_DB_PASSWORD (default: the service name);
# keep them free of characters that need escaping in a URL, since the
# services' DATABASE_URLs embed them.
set -e # not -u: the image sources the script when it is not executable

run_psql() {
	psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet \
		--username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" "$@"
}

for service in order payment inventory notify; do
	password_var=$(printf '%s_DB_PASSWORD' "$service" | tr '[:lower:]' '[:upper:]')
	eval "password=\${$password_var:-$service}"
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

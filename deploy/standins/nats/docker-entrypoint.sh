#!/bin/sh
# The stand-in nats image's entrypoint, as the official alpine image's:
# arguments starting with "-" are nats-server's, anything else is run.
set -e
if [ "${1#-}" != "$1" ]; then
	set -- nats-server "$@"
fi
exec "$@"

#!/usr/bin/env bash
# Builds offline stand-ins for the third-party images the compose demo and
# the container tests use, on a Docker engine that reaches no registry, and
# prints the `export` lines that select them (POSTGRES_IMAGE, NATS_IMAGE,
# MAILPIT_IMAGE, GO_IMAGE). Each stand-in is a root filesystem made here and
# `docker import`ed; its tag ends in a hash of its inputs, so a second run
# finds every image present and builds nothing. Where `docker compose`
# (Compose v2) is missing, it is built from its Go module too.
#
#   postgres  the host's PostgreSQL 15 (Debian's postgresql-15: .ci/run
#             installs it) with the libraries it links, busybox, and an
#             entrypoint honouring the official image's contract
#             (postgres/docker-entrypoint.sh).
#   nats      nats-server at go.mod's version, busybox (sh, wget for the
#             healthcheck), the official alpine image's entrypoint.
#   mailpit   Mailpit from its Go module: SMTP on 1025, UI and API on 8025.
#   go        the host's Go (/usr/local/go) and busybox, for the Dockerfile's
#             build stage (GO_IMAGE).
#
# Needs: docker, go, busybox-static and postgresql-15 from Debian.
# Progress goes to stderr, the export lines to stdout:
#   eval "$(deploy/standins/build.sh)"
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/deploy/standins
cache=${STANDIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow-standins}
mkdir -p "$cache"
export PATH="/usr/local/go/bin:$PATH"

log() { printf 'standins: %s\n' "$*" >&2; }

# inputs_hash prints a short hash of its arguments' text, of the files
# named after "--", and of the functions that build an image (the caller's
# and those they call), so that an edit elsewhere in this script rebuilds
# nothing.
inputs_hash() {
	local text=() files=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do text+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	files=("$@")
	{
		printf '%s\n' "${text[@]}"
		declare -f "${FUNCNAME[1]}" new_rootfs copy_libs import_rootfs go_tool_build
		cat "${files[@]}" /dev/null
	} | sha256sum | cut -c1-12
}

present() { docker image inspect "$1" >/dev/null 2>&1; }

deb_version() { dpkg-query -W -f '${Version}' "$1"; }

# new_rootfs makes an empty root filesystem with busybox as /bin/sh and its
# applets, /tmp, and the users root and postgres (uid 70, as in alpine).
new_rootfs() {
	local dir=$1
	rm -rf "$dir"
	mkdir -p "$dir"/{usr/bin,usr/lib,usr/lib64,etc,tmp,root}
	ln -s usr/bin "$dir/bin"
	ln -s usr/bin "$dir/sbin"
	ln -s usr/lib "$dir/lib"
	ln -s usr/lib64 "$dir/lib64"
	chmod 1777 "$dir/tmp"
	cp /bin/busybox "$dir/usr/bin/busybox"
	local applet
	for applet in $(busybox --list); do
		case "$applet" in busybox | \[ | \[\[) continue ;; esac
		[ -e "$dir/usr/bin/$applet" ] || ln -s busybox "$dir/usr/bin/$applet"
	done
	ln -s busybox "$dir/usr/bin/["
	printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:70:70:postgres:/var/lib/postgresql:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$dir/etc/passwd"
	printf 'root:x:0:\npostgres:x:70:\nnogroup:x:65534:\n' >"$dir/etc/group"
	printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
	mkdir -p "$dir/etc/ssl/certs"
	cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
}

# copy_libs copies into dir the shared libraries the given ELF files link.
copy_libs() {
	local dir=$1; shift
	local lib
	for lib in $(ldd "$@" 2>/dev/null | awk '$3 ~ /^\// {print $3} $1 ~ /^\/lib64\// {print $1}' | sort -u); do
		mkdir -p "$dir$(dirname "$lib")"
		[ -e "$dir$lib" ] || cp -L "$lib" "$dir$lib"
	done
}

# import_rootfs imports dir as the image tag, with the Dockerfile
# instructions given.
import_rootfs() {
	local dir=$1 tag=$2; shift 2
	local changes=() c
	for c in "$@"; do changes+=(--change "$c"); done
	tar -C "$dir" --numeric-owner -c . | docker import "${changes[@]}" - "$tag" >/dev/null
	rm -rf "$dir"
	# The stand-ins of older inputs are of no use any more.
	local old
	for old in $(docker image ls --format '{{.Repository}}:{{.Tag}}' "${tag%:*}"); do
		[ "$old" = "$tag" ] || docker image rm "$old" >/dev/null || true
	done
}

build_postgres() {
	local pgbin=/usr/lib/postgresql/15/bin
	[ -x "$pgbin/postgres" ] || { log "PostgreSQL 15 is not installed (apt-get install postgresql-15)"; return 1; }
	local version hash tag
	version=$("$pgbin/postgres" --version | awk '{print $3}')
	hash=$(inputs_hash "postgresql-15 $(deb_version postgresql-15)" "busybox $(deb_version busybox-static)" -- "$here/postgres/docker-entrypoint.sh")
	tag=onceflow-standin/postgres:$version-$hash
	POSTGRES_IMAGE=$tag
	if present "$tag"; then log "postgres: $tag is present"; return; fi
	log "postgres: building $tag from the host's PostgreSQL $version"
	local dir=$cache/rootfs-postgres
	new_rootfs "$dir"
	mkdir -p "$dir/usr/lib/postgresql" "$dir/usr/share/postgresql" "$dir/usr/lib/locale" "$dir/usr/share"
	# Without llvmjit (and its 100 MB LLVM), JIT is simply unavailable.
	cp -a /usr/lib/postgresql/15 "$dir/usr/lib/postgresql/"
	rm -rf "$dir"/usr/lib/postgresql/15/lib/llvmjit* "$dir"/usr/lib/postgresql/15/lib/bitcode
	cp -a /usr/share/postgresql/15 "$dir/usr/share/postgresql/"
	cp -a /usr/share/zoneinfo "$dir/usr/share/"
	cp -a /usr/lib/locale/C.utf8 "$dir/usr/lib/locale/"
	copy_libs "$dir" "$pgbin"/* "$dir"/usr/lib/postgresql/15/lib/*.so
	install -m 0755 "$here/postgres/docker-entrypoint.sh" "$dir/usr/bin/docker-entrypoint.sh"
	mkdir -p "$dir/var/lib/postgresql/data" "$dir/var/run/postgresql" "$dir/docker-entrypoint-initdb.d"
	chown -R 70:70 "$dir/var/lib/postgresql" "$dir/var/run/postgresql"
	chmod 3777 "$dir/var/run/postgresql"
	import_rootfs "$dir" "$tag" \
		"ENV PATH=$pgbin:/usr/bin LANG=C.UTF-8 PGDATA=/var/lib/postgresql/data" \
		"LABEL org.onceflow.standin=postgres org.onceflow.standin.inputs=$hash" \
		'VOLUME /var/lib/postgresql/data' \
		'EXPOSE 5432' \
		'ENTRYPOINT ["docker-entrypoint.sh"]' \
		'CMD ["postgres"]'
}

# go_tool_build builds a Go main package of a module version into out,
# statically, with the -X flags given; a module whose go.mod has replace or
# exclude directives is built as the main module, from its source in the
# module cache.
go_tool_build() {
	local module=$1 version=$2 pkg=$3 out=$4 x=${5:-}
	[ -x "$out" ] && return
	local src
	src=$(cd "$root" && go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	local work=$cache/src-$(basename "$out")
	rm -rf "$work"
	cp -r "$src" "$work"
	chmod -R u+w "$work"
	(cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w $x" -o "$out.tmp" "$pkg")
	mv "$out.tmp" "$out"
	rm -rf "$work"
}

build_nats() {
	local version hash tag
	version=$(cd "$root" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
	hash=$(inputs_hash "nats-server $version" "$(go version)" "busybox $(deb_version busybox-static)" -- "$here/nats/docker-entrypoint.sh")
	tag=onceflow-standin/nats:${version#v}-$hash
	NATS_IMAGE=$tag
	if present "$tag"; then log "nats: $tag is present"; return; fi
	log "nats: building $tag (nats-server $version)"
	local dir=$cache/rootfs-nats
	new_rootfs "$dir"
	mkdir -p "$dir/usr/local/bin" "$dir/etc/nats"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$dir/usr/local/bin/nats-server" github.com/nats-io/nats-server/v2)
	install -m 0755 "$here/nats/docker-entrypoint.sh" "$dir/usr/local/bin/docker-entrypoint.sh"
	printf 'port: 4222\nmonitor_port: 8222\njetstream: enabled\n' >"$dir/etc/nats/nats-server.conf"
	import_rootfs "$dir" "$tag" \
		'ENV PATH=/usr/local/bin:/usr/bin' \
		"LABEL org.onceflow.standin=nats org.onceflow.standin.inputs=$hash" \
		'EXPOSE 4222 6222 8222' \
		'ENTRYPOINT ["docker-entrypoint.sh"]' \
		'CMD ["nats-server", "--config", "/etc/nats/nats-server.conf"]'
}

build_mailpit() {
	local version=v1.33.1 hash tag
	hash=$(inputs_hash "mailpit $version" "$(go version)" "busybox $(deb_version busybox-static)")
	tag=onceflow-standin/mailpit:${version#v}-$hash
	MAILPIT_IMAGE=$tag
	if present "$tag"; then log "mailpit: $tag is present"; return; fi
	log "mailpit: building $tag (Mailpit $version)"
	local dir=$cache/rootfs-mailpit
	new_rootfs "$dir"
	go_tool_build github.com/axllent/mailpit "$version" . "$cache/mailpit-$version"
	cp "$cache/mailpit-$version" "$dir/mailpit"
	import_rootfs "$dir" "$tag" \
		"LABEL org.onceflow.standin=mailpit org.onceflow.standin.inputs=$hash" \
		'EXPOSE 1025 8025' \
		'ENTRYPOINT ["/mailpit"]'
}

build_go() {
	local version hash tag
	version=$(go env GOVERSION)
	hash=$(inputs_hash "$(go version)" "busybox $(deb_version busybox-static)")
	tag=onceflow-standin/golang:${version#go}-$hash
	GO_IMAGE=$tag
	if present "$tag"; then log "go: $tag is present"; return; fi
	log "go: building $tag from the host's $version"
	local dir=$cache/rootfs-go goroot
	goroot=$(go env GOROOT)
	new_rootfs "$dir"
	mkdir -p "$dir/usr/local" "$dir/go"
	cp -a "$goroot" "$dir/usr/local/go"
	import_rootfs "$dir" "$tag" \
		'ENV PATH=/go/bin:/usr/local/go/bin:/usr/bin GOPATH=/go GOTOOLCHAIN=local' \
		"LABEL org.onceflow.standin=golang org.onceflow.standin.inputs=$hash" \
		'WORKDIR /go'
}

# build_compose installs Compose v2 as the docker CLI's plugin where
# `docker compose` is missing.
build_compose() {
	if docker compose version >/dev/null 2>&1; then
		log "compose: $(docker compose version)"
		return
	fi
	local version=v2.40.3 plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
	log "compose: building Compose $version from its Go module"
	go_tool_build github.com/docker/compose/v2 "$version" ./cmd "$cache/docker-compose-$version" \
		"-X github.com/docker/compose/v2/internal.Version=$version"
	mkdir -p "$plugins"
	install -m 0755 "$cache/docker-compose-$version" "$plugins/docker-compose"
	log "compose: $(docker compose version)"
}

# Arguments name what to build (postgres nats mailpit go compose), all
# by default; the exports are those of the images built or found.
POSTGRES_IMAGE= NATS_IMAGE= MAILPIT_IMAGE= GO_IMAGE=
for what in "${@:-postgres nats mailpit go compose}"; do
	for w in $what; do "build_$w"; done
done
printf 'export POSTGRES_IMAGE=%s\nexport NATS_IMAGE=%s\nexport MAILPIT_IMAGE=%s\nexport GO_IMAGE=%s\n' \
	"$POSTGRES_IMAGE" "$NATS_IMAGE" "$MAILPIT_IMAGE" "$GO_IMAGE"
# For testcontainers (TEST_CONTAINERS=on): its reaper's image cannot be
# pulled either, and on a machine that looks like a container (/.dockerenv)
# it would dial the containers' ports on the default gateway, where
# testenv.OnLoopback does not publish them.
printf 'export TESTCONTAINERS_RYUK_DISABLED=true\nexport TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1\n'

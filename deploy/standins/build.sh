#!/usr/bin/env bash
# Builds offline stand-ins for the third-party images the compose demo and
# the container tests use, on a Docker engine that reaches no registry, and
# prints the `export` lines that select them (POSTGRES_IMAGE, NATS_IMAGE,
# MAILPIT_IMAGE, GO_IMAGE, PROMETHEUS_IMAGE, JAEGER_IMAGE, GRAFANA_IMAGE).
# Each stand-in is a root filesystem made here and `docker import`ed; its
# tag ends in a hash of its inputs, so a second run finds every image
# present and builds nothing. Where `docker compose` (Compose v2) is
# missing, it is built from its Go module too.
#
#   postgres    the host's PostgreSQL 15 (Debian's postgresql-15: .ci/run
#               installs it) with the libraries it links, busybox, and an
#               entrypoint honouring the official image's contract
#               (postgres/docker-entrypoint.sh).
#   nats        nats-server at go.mod's version, busybox (sh, wget for the
#               healthcheck), the official alpine image's entrypoint.
#   mailpit     Mailpit from its Go module: SMTP on 1025, UI and API on 8025.
#   go          the host's Go (/usr/local/go) and busybox, for the
#               Dockerfile's build stage (GO_IMAGE).
#   prometheus  Debian's prometheus package (a real Prometheus, 2.42) and the
#               JavaScript its classic UI links, unpacked, not installed.
#   jaeger      NOT Jaeger: jaeger/, a program of this repository that takes
#               OTLP in and answers Jaeger's query API; no UI.
#   grafana     NOT Grafana: grafana/, a program of this repository that
#               answers Grafana's HTTP API for the provisioned dashboards and
#               proxies their queries to Prometheus; no UI.
#
# Needs: docker, go, busybox-static and postgresql-15 from Debian, and
# apt-get (prometheus's packages are fetched with apt-get download).
# STANDIN_CACHE (~/.cache/onceflow-standins) keeps the downloads and the
# binaries built from modules; STANDIN_REPO (onceflow-standin) is the
# images' repository prefix; DOCKER_CONFIG is where Compose v2 is put.
# Progress goes to stderr, the export lines to stdout:
#   eval "$(deploy/standins/build.sh)"
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/deploy/standins
cache=${STANDIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow-standins}
# The images' repository prefix: another one builds a second set beside
# the first without touching it (a measurement of a first build, say).
repo=${STANDIN_REPO:-onceflow-standin}
mkdir -p "$cache"
# Runs at once (CI beside a developer's `make demo-images`) would share the
# cache's working directories and remove each other's root filesystems
# mid-build: a second run waits for the first, then finds its images present.
exec 9>"$cache/.lock"
if ! flock -n 9; then
	printf 'standins: waiting for another build.sh on %s\n' "$cache" >&2
	flock 9
fi
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
	tag=$repo/postgres:$version-$hash
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
	tag=$repo/nats:${version#v}-$hash
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
	tag=$repo/mailpit:${version#v}-$hash
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
	tag=$repo/golang:${version#go}-$hash
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

# build_prometheus: Debian's prometheus package (a real Prometheus, 2.42;
# the official image is 3.x) with the JavaScript packages its classic UI
# links, fetched with apt-get download and unpacked, not installed.
# Debian's binary keeps its data in /var/lib/prometheus/metrics2, the
# official image in /prometheus (its VOLUME, the working directory): a
# link joins the two.
build_prometheus() {
	local pkgs="prometheus fonts-glyphicons-halflings libjs-bootstrap4 libjs-d3 libjs-eonasdan-bootstrap-datetimepicker libjs-jquery libjs-jquery-hotkeys libjs-moment libjs-moment-timezone libjs-mustache libjs-popper.js libjs-rickshaw"
	local debs=$cache/debs-prometheus version hash tag
	apt_download "$debs" $pkgs
	version=$(dpkg-deb -f "$debs"/prometheus_*.deb Version)
	hash=$(inputs_hash "$(cd "$debs" && ls)" "busybox $(deb_version busybox-static)")
	version=${version%%+*}
	tag=$repo/prometheus:$version-$hash
	PROMETHEUS_IMAGE=$tag
	if present "$tag"; then log "prometheus: $tag is present"; return; fi
	log "prometheus: building $tag from Debian's prometheus $version"
	local dir=$cache/rootfs-prometheus unpacked=$cache/unpacked-prometheus deb p
	rm -rf "$unpacked"
	for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
	# Not the packages' systemd units and docs, nor moment-timezone's 200 MB
	# of raw zone data (the UI loads moment-timezone-with-data).
	rm -rf "$unpacked"/usr/share/javascript/moment-timezone/data
	new_rootfs "$dir"
	for p in usr/bin/prometheus usr/bin/promtool etc/prometheus usr/share/prometheus usr/share/javascript usr/share/nodejs usr/share/fonts-glyphicons usr/share/fonts; do
		mkdir -p "$dir/$(dirname "$p")"
		cp -a "$unpacked/$p" "$dir/$p"
	done
	rm -rf "$unpacked"
	copy_libs "$dir" "$dir/usr/bin/prometheus" "$dir/usr/bin/promtool"
	mkdir -p "$dir/prometheus" "$dir/var/lib/prometheus"
	ln -s /prometheus "$dir/var/lib/prometheus/metrics2"
	chown 65534:65534 "$dir/prometheus"
	import_rootfs "$dir" "$tag" \
		'ENV PATH=/usr/bin' \
		"LABEL org.onceflow.standin=prometheus org.onceflow.standin.inputs=$hash" \
		'USER nobody' \
		'WORKDIR /prometheus' \
		'VOLUME /prometheus' \
		'EXPOSE 9090' \
		'ENTRYPOINT ["/bin/prometheus"]' \
		'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
}

# apt_download fetches the named Debian packages' .deb files (their
# candidate versions) into dir, once; apt's lists are updated if they are
# missing.
apt_download() {
	local dir=$1; shift
	[ -e "$dir/.complete" ] && return
	rm -rf "$dir"
	mkdir -p "$dir"
	if ! (cd "$dir" && apt-get download -q "$@" >/dev/null 2>&1); then
		apt-get update -qq
		(cd "$dir" && apt-get download -q "$@" >/dev/null)
	fi
	touch "$dir/.complete"
}

# build_own builds the stand-in that is a program of this repository,
# deploy/standins/NAME (a main package), into onceflow-standin/NAME, and
# sets the variable named var to its tag; the other arguments are the
# image's Dockerfile instructions.
build_own() {
	local name=$1 var=$2; shift 2
	local hash tag srcs
	srcs=$(ls "$here/$name"/*.go | grep -v '_test\.go$')
	# shellcheck disable=SC2086 # one file a line
	hash=$(inputs_hash "$(go version)" "busybox $(deb_version busybox-static)" "$*" -- $srcs "$root/internal/httpserve/httpserve.go" "$root/go.mod" "$root/go.sum")
	tag=$repo/$name:standin-$hash
	printf -v "$var" %s "$tag"
	if present "$tag"; then log "$name: $tag is present"; return; fi
	log "$name: building $tag from deploy/standins/$name (a stand-in: its API, no UI)"
	local dir=$cache/rootfs-$name
	new_rootfs "$dir"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$dir/usr/bin/$name" "./deploy/standins/$name")
	import_rootfs "$dir" "$tag" "LABEL org.onceflow.standin=$name org.onceflow.standin.inputs=$hash" "$@"
}

# build_jaeger: not Jaeger (whose all-in-one builds from its Go module in
# about 7 minutes of CPU, without its npm-built UI) but a small program
# of this repository that receives OTLP on 4317 and 4318, keeps the traces
# in memory and answers Jaeger's query API on 16686.
build_jaeger() {
	build_own jaeger JAEGER_IMAGE \
		'USER 10001' \
		'EXPOSE 4317 4318 14269 16686' \
		'ENTRYPOINT ["/usr/bin/jaeger"]'
}

# build_grafana: not Grafana (its frontend needs npm, its backend is far
# too big to build here) but a small program of this repository that
# answers Grafana's HTTP API for the provisioned dashboards and data
# sources, the data source proxy included; no UI.
build_grafana() {
	build_own grafana GRAFANA_IMAGE \
		'ENV GF_PATHS_PROVISIONING=/etc/grafana/provisioning' \
		'USER 472' \
		'WORKDIR /usr/share/grafana' \
		'EXPOSE 3000' \
		'ENTRYPOINT ["/usr/bin/grafana"]'
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

# Arguments name what to build (postgres nats mailpit go compose
# prometheus jaeger grafana), all by default; the exports are those of the
# images built or found.
POSTGRES_IMAGE= NATS_IMAGE= MAILPIT_IMAGE= GO_IMAGE= PROMETHEUS_IMAGE= JAEGER_IMAGE= GRAFANA_IMAGE=
for what in "${@:-postgres nats mailpit go compose prometheus jaeger grafana}"; do
	for w in $what; do "build_$w"; done
done
for v in POSTGRES_IMAGE NATS_IMAGE MAILPIT_IMAGE GO_IMAGE PROMETHEUS_IMAGE JAEGER_IMAGE GRAFANA_IMAGE; do
	# An image not asked for is not exported: compose keeps its default.
	[ -n "${!v}" ] && printf 'export %s=%s\n' "$v" "${!v}"
done
# For testcontainers (TEST_CONTAINERS=on): its reaper's image cannot be
# pulled either, and on a machine that looks like a container (/.dockerenv)
# it would dial the containers' ports on the default gateway, where
# testenv.OnLoopback does not publish them.
printf 'export TESTCONTAINERS_RYUK_DISABLED=true\nexport TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1\n'

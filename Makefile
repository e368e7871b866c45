# The two commands that matter: `make test` (what CI runs) and `make run`.
GO ?= go

.PHONY: test run generate verify-sqlc vet build bench demo-images demo-test

## test: every test against real PostgreSQL and NATS JetStream, race detector on
test:
	$(GO) test -race -timeout 30m ./...

## run: the four services on this machine, seeded (onceflow dev --seed)
run:
	$(GO) run ./cmd/onceflow dev --seed

# sqlc without cgo parses PostgreSQL with its WebAssembly libpg_query: the
# same code, a first build of 1.5 CPU minutes instead of 4, no C compiler.
SQLC = CGO_ENABLED=0 $(GO) tool sqlc

## generate: regenerate the sqlc code after editing db/queries or db/migrations
generate:
	$(SQLC) generate

## verify-sqlc: fail if the committed sqlc code is stale
verify-sqlc:
	$(SQLC) diff

# -race: vet compiles what make test compiles, once for both.
vet:
	$(GO) vet -race ./...

build:
	$(GO) build -o bin/onceflow ./cmd/onceflow

## bench: the benchmarks side by side (real PostgreSQL, fast and durable, and NATS), with the ratios against the targets; BENCH=regexp COUNT=n EVENTS=n narrow it
bench:
	bash bench/run.sh

## demo-images: build the offline stand-ins of the compose demo's third-party images (and Compose v2 if `docker compose` is missing), cached by content; prints the exports that select them
demo-images:
	@bash deploy/standins/build.sh

## demo-test: the compose demo end to end on a Docker engine (stand-ins built first): up, the README's calls, a container restarted and NATS killed mid-load, the audit, down -v
demo-test:
	eval "$$(bash deploy/standins/build.sh)" && COMPOSE_DEMO_TEST=1 $(GO) test -race -count=1 -v -timeout 30m ./e2e/compose

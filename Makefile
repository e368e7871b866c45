# The two commands that matter: `make test` (what CI runs) and `make run`;
# `make test-short` is the fast tier.
GO ?= go

.PHONY: test test-short slowest stress run schema generate verify-sqlc vet build bench demo-images demo-test

# gotestsum (go.mod's tool) runs go test -json: one line per package and
# the failures' output on the terminal, every test event in TEST_JSON.
GOTESTSUM = $(GO) tool gotestsum
TEST_JSON ?= bin/test.json

## test: every test against real PostgreSQL and NATS JetStream, race detector on; every test event in TEST_JSON (bin/test.json)
test:
	@mkdir -p $(dir $(TEST_JSON))
	$(GOTESTSUM) --format pkgname-and-test-fails --jsonfile $(TEST_JSON) -- -race -timeout 30m ./...

## test-short: the fast tier (-short): every test but the e2e system's, the browser's and Docker's, against real PostgreSQL and NATS
test-short:
	$(GO) test -race -short -timeout 30m ./...

## slowest: the 20 slowest tests of the last make test (TEST_JSON)
slowest:
	$(GOTESTSUM) tool slowest --jsonfile $(TEST_JSON) --num 20 --threshold 0

# stress: the load is one busy loop per core (LOAD), at the tests' own
# priority, started before go test and killed when it ends, however it
# ends.
COUNT ?= 20
LOAD ?= $(shell nproc)
STRESS_TIMEOUT ?= 2h

## stress: PKG's tests COUNT times (20) under a CPU load it starts and stops (LOAD busy loops, one per core); RUN=regexp narrows them, e.g. make stress PKG=./e2e COUNT=5 RUN='^TestCrash$$'
stress:
	@test -n "$(PKG)" || { echo 'usage: make stress PKG=./internal/inbox [COUNT=20] [RUN=regexp] [LOAD=n]' >&2; exit 2; }
	@loops=""; \
	trap 'kill $$loops 2>/dev/null' EXIT; \
	trap 'exit 130' INT TERM HUP; \
	for _ in $$(seq $(LOAD)); do sh -c 'while :; do :; done' & loops="$$loops $$!"; done; \
	echo "stress: $(PKG) $(COUNT) times beside $(LOAD) busy loops (pids$$loops)"; \
	$(GO) test -race -count=$(COUNT) -timeout $(STRESS_TIMEOUT) $(if $(RUN),-run '$(RUN)') $(PKG)

## run: the four services on this machine, seeded (onceflow dev --seed)
run:
	$(GO) run ./cmd/onceflow dev --seed

# sqlc without cgo parses PostgreSQL with its WebAssembly libpg_query: the
# same code, a first build of 1.5 CPU minutes instead of 4, no C compiler.
SQLC = CGO_ENABLED=0 $(GO) tool sqlc

## schema: rewrite db/schema (each database as its migrations leave it, read by sqlc) from freshly migrated databases; make test fails while it is stale
schema:
	$(GO) test -count=1 -run '^TestSchemaFilesAreCurrent$$' ./db -args -update

## generate: regenerate the sqlc code after editing db/queries or db/schema (make schema)
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

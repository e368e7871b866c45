# The two commands that matter: `make test` (what CI runs) and `make run`.
GO ?= go

.PHONY: test generate verify-sqlc vet build bench

## test: every test against real PostgreSQL and NATS JetStream, race detector on
test:
	$(GO) test -race ./...

## generate: regenerate the sqlc code after editing db/queries or db/migrations
generate:
	$(GO) tool sqlc generate

## verify-sqlc: fail if the committed sqlc code is stale
verify-sqlc:
	$(GO) tool sqlc diff

vet:
	$(GO) vet ./...

build:
	$(GO) build -o bin/onceflow ./cmd/onceflow

## bench: the benchmarks side by side (real PostgreSQL, fast and durable, and NATS), with the ratios against the targets; BENCH=regexp COUNT=n EVENTS=n narrow it
bench:
	bash bench/run.sh

// Package bench holds onceflow's performance benchmarks and nothing else:
// its code is all in _test.go files, so `go test ./...` only compiles the
// benchmarks and runs the package's few quick tests, which check that each
// benchmarked workload does the work it claims, and how the CPU figure is
// read.
//
// Every benchmark reports events/s as a custom metric, so that figures of
// one run can be compared as ratios: the database's limit (the inbox's SQL
// issued straight from Go), the broker's limit (async publish, pull-consume
// with acks), the inbox consumer unbatched, batched and batched set-based,
// a naive consumer with the same handler and no inbox, each service's
// handlers through the inbox (per event, set-based, set-based on two
// workers), notify's mailer, the outbox relay, and a Watermill
// forwarder as a peer baseline. Each one that touches PostgreSQL runs on the
// test environment's fast cluster (fsync off) and on a durable local cluster
// (PostgreSQL's crash-safe defaults): the durable figures are the honest
// ones. bench/run.sh runs them side by side and prints the ratios against
// the project's targets (`make bench`), with each benchmark's CPU time per
// event (cpu-us/event, the whole machine's: PostgreSQL, NATS and the code
// measured) and the rate that allows with every core busy; bench/e2e.sh
// drives `onceflow dev` with loadgen, and bench/ab.sh compares two builds
// end to end in alternating runs.
package bench

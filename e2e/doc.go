// Package e2e is the end-to-end fault-injection suite of onceflow. It holds
// only tests: `go test ./e2e` (part of `go test ./...`) builds the onceflow
// binary and a nats-server binary from the pinned module, starts PostgreSQL
// (TEST_DATABASE_URL's server, else a testcontainers-go container when a
// Docker engine answers, else a durable cluster from the local installation),
// and then, for each scenario, creates the four service databases, runs NATS
// and every service as its own OS process, drives orders through the HTTP
// APIs with a client that retries under the same Idempotency-Key, injects
// the scenario's fault, waits until the system is quiet, and checks it: with
// the invariant auditor (internal/audit) and with the client's own record of
// what it asked for (one order per key, credits applied once, stock as set,
// one committed handler run per event and consumer).
//
// Each scenario logs one figures line (go test -v shows it):
//
//	figures: scenario=Crash orders=612 (confirmed=… rejected=… cancelled=…) duplicates_dropped=… redeliveries=… faults=… dlq=0 violations=0 …
//
// The scenarios run one after the other, never in parallel: they kill and
// restart shared servers and they need the machine's cores. E2E_SCALE (a
// positive number, default 1) multiplies the load of every scenario, for a
// longer soak. A failing scenario dumps the end of every process's log.
// `go test -count=10 -run Crash ./e2e` is the stress mode.
package e2e

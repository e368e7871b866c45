// Package e2e is the end-to-end fault-injection suite of onceflow. It holds
// only tests; `go test ./e2e` (part of `go test ./...`) runs it.
//
// TestMain builds the onceflow binary and a nats-server binary from the
// module pinned in go.mod (both without the race detector, as they run in
// production; every scenario opens their sources, so that `go test`'s
// result cache sees a change to them and runs the suite again), and starts
// PostgreSQL: TEST_DATABASE_URL's server if set, else a testcontainers-go
// container when a Docker engine answers, else a durable cluster (fsync on)
// from the local installation. Each scenario then
// creates its four service databases, starts its own nats-server process
// (with deploy/nats/onceflow.conf's JetStream settings, sync_interval
// always included), runs every service instance as its own OS process with
// its log in the test's temporary directory, waits for /readyz, and drives
// orders through the HTTP APIs with a client that retries transport errors,
// time-outs, 5xx and 409 under the same Idempotency-Key. It injects its
// fault during the load, waits until the system is quiet, and checks it
// twice: with the invariant auditor (internal/audit), and with the client's
// own record of what it asked for — one order per Idempotency-Key, every
// accepted credit applied once, available + reserved = the stock level it
// set, and each consumer's committed handler runs (its "processed" counter,
// summed over instances and restarts) never more than its inbox rows.
//
// Each scenario logs one figures line (go test -v shows it):
//
//	figures: scenario=TestCrash orders=484 (confirmed=354 rejected=100 cancelled=30 expired=0) duplicates_dropped=94 redeliveries=161 faults=10 (kill_9:order=3 … self_kill_after_commit:payment=4) observed=() dlq=0 violations=0 …
//
// duplicates_dropped sums onceflow_inbox_messages_total{outcome="duplicate"}
// over the instances' /metrics (scraped every half second and before each
// kill, so a lower bound where processes die); redeliveries is JetStream's
// count of deliveries beyond the first (each durable's delivered consumer
// sequence minus the messages it subscribes to); dlq is the auditor's count
// of DLQ entries; violations counts the auditor's and the client's;
// observed is what a scenario saw happen as evidence that its fault met what
// it aimed at (e.g. events a relay published again after a database crash,
// seen by a plain NATS subscriber on the wire).
//
// The TestCluster* scenarios run the same system on a three-node cluster of
// nats-server processes (routes on loopback, R3 streams and consumers,
// every service given the three URLs) and kill, cut off (toxiproxy on the
// routes) or restart nodes during a shorter load; TestClusterAtomicBatches
// shows, from what the wire carries, that a stream leader was killed while
// an atomic batch was under way and that a batch holding an event already
// stored was refused (error 10201) and published again a message at a
// time.
//
// TestDatabaseFailover runs the four databases on a Patroni cluster of
// their own (package hapg: a primary, a synchronous standby and etcd, from
// Debian's patroni and etcd-server), reached through a multi-host URL, and
// switches it over and then kills its primary's node during the load.
//
// The scenarios run two at a time (t.Parallel), each on its own NATS server,
// processes and databases, except TestDatabaseRestart and
// TestDatabaseCrash, which restart or crash the shared PostgreSQL server
// and so run alone. A failing scenario dumps the
// end of every process's log. E2E_SCALE (a positive number, default 1)
// multiplies every scenario's load for a longer soak;
// `go test -timeout 60m -count=10 -run TestCrash ./e2e` is the stress mode
// (ten runs of a scenario outlast go test's default -timeout of 10m).
//
// A scenario's checks of what its fault met do not rest on timing: the
// test arranges the moment (TestDatabaseCrash holds the row locks the
// services' next writes need until a relay's mark and a handler wait behind
// them, then kills; TestClusterAtomicBatches freezes the stream leader the
// moment a batch is on the wire; TestReplicas freezes the busy instances
// until another works), awaits it, or says in a comment why it always
// happens.
package e2e

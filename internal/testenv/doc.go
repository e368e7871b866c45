// Package testenv gives tests real servers: a fresh, migrated PostgreSQL
// database per test and a NATS server with JetStream. An embedded NATS server
// trusts only natsauth's identities: NATS.Client gives each service, the
// provisioner and the operator its own credentials, and NATS.Conn connects
// as the test, with every right. NewHADatabase gives a test a highly
// available database of its own instead: a Patroni cluster of a primary and
// a standby (package hapg), which the test can switch over, kill and hold
// back. It is imported only by _test.go files; a package that uses it runs
// its tests through Run, which stops the shared servers when they are done
// (without it, a test that asks for one fails):
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
//
// testenv owns the servers shared by one test binary and their teardown. It
// decides once per binary where PostgreSQL comes from: the server named by
// TEST_DATABASE_URL; else a testcontainers postgres when containers are
// chosen; else a local cluster from the PostgreSQL installation (package
// localpg). NATS likewise: TEST_NATS_URL; else one testcontainers nats for
// the binary; else an embedded nats-server per test. Containers are chosen
// by TEST_CONTAINERS (ChooseContainers): on, off, or auto (the default),
// which uses them only when a Docker engine answers and already holds the
// images (POSTGRES_IMAGE and NATS_IMAGE, the official ones by default), so
// that a machine with an engine and no registry never tries a pull. The log
// says which source was taken and why. Tests never skip for want of a server.
//
// Guarantees: every NewDatabase call returns its own database, cloned from a
// template migrated once per schema and binary, and dropped when the test
// ends. An embedded NATS server belongs to one test; a shared one (URL or
// container) is held by one test at a time, and its streams are deleted when
// that test ends, so stream names need not be unique. FreePorts gives a test
// ports for servers it starts by number, which no other process takes by
// chance before the server binds one or while it restarts. After the tests
// pass, Run fails the binary if goroutines leaked.
package testenv

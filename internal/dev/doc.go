// Package dev runs the whole of onceflow in one process: a PostgreSQL server
// with one database per service (a throwaway local cluster, or an existing
// server), an embedded NATS server with JetStream that trusts only the
// identities of package natsauth (credentials issued per run, each service
// its own; anonymous connections refused), the streams provisioned as
// `onceflow provision` would, and the four services order, payment,
// inventory and notify, each through its own Run function, exactly as the
// one-service commands run them.
//
// It is `onceflow dev`, and the harness of in-process system tests: the zero
// Config listens on ports the system picks, and Start hands each service a
// listener it has already opened, so that tests never race for ports.
//
// Guarantees: Start returns only once every service answers /readyz, or
// returns an error having undone everything it started. Stop stops the
// services first (they finish in-flight work and flush their outboxes while
// NATS and PostgreSQL are still up), then the token issuer whose key set
// they fetch, then NATS, then the cluster, and removes every directory Start
// created. No client can make Stop fail or hang: each HTTP server gets its
// grace (a service's SHUTDOWN_TIMEOUT, the issuer's 5s) and then closes the
// connections left (package httpserve). Databases on a server named by
// Config.DatabaseURL are created when missing and never dropped.
package dev

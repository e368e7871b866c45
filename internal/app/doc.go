// Package app runs one onceflow service: it reads the configuration every
// service shares, migrates the service's database, provisions the JetStream
// topology, and runs the service's inbox consumers, its outbox relay, the
// cleaners and its HTTP server until the context ends — then stops in the
// order that loses nothing: stop fetching and serving, finish in-flight
// work, flush the outbox, close the connections.
//
// A service supplies only what is its own (Spec): handlers per subscription,
// HTTP routes and any extra background loop.
package app

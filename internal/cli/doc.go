// Package cli is the onceflow command line: a command per service
// (order, payment, inventory, notify), dev, migrate, outbox redrive and
// healthcheck. main only gives Run the arguments, the output streams and a
// context that ends on SIGINT or SIGTERM.
//
// Environment variables are read here and in the services' LoadConfig,
// nowhere else: each command parses what it needs with caarlos0/env, and
// the log handler (LOG_FORMAT, LOG_LEVEL) is chosen once, in Run.
package cli

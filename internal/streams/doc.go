// Package streams describes onceflow's JetStream topology — the streams, the
// dead-letter stream and the durable pull consumers — in one declarative
// value, and provisions it idempotently at start-up.
//
// Replicas, storage, duplicate window and max age are configuration, so the
// same description runs on a single dev server and on a 3-node cluster with
// R3 streams.
package streams

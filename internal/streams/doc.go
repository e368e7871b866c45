// Package streams describes onceflow's JetStream topology — the streams, the
// dead-letter stream and the durable pull consumers — in one declarative
// value, and provisions it idempotently at start-up.
//
// Replicas, storage, duplicate window and max age are configuration, so the
// same description runs on a single dev server and on a 3-node cluster with
// R3 streams. The DLQ gives each durable a budget of its own (a per-subject
// limit that refuses the new), and every identity's NATS permissions are
// derived from the topology (Topology.Permissions).
package streams

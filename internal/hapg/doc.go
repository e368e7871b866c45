// Package hapg runs a highly available PostgreSQL for tests: one etcd and a
// Patroni cluster of two PostgreSQL nodes on 127.0.0.1, a primary and a
// standby, from Debian's patroni and etcd-server packages and a PostgreSQL
// installation. It is what a service database looks like once users make it
// highly available, small enough to start in a test.
//
// By default Patroni's synchronous_mode is on: the standby is synchronous,
// and a commit returns only once the standby has the commit's WAL, so a
// failover loses no committed transaction. Config.Async turns it off, as
// PostgreSQL's default replication is, for tests that show what that loses.
//
// Guarantees: Start returns once the primary accepts writes and the standby
// streams from it (synchronously unless Async); URL connects to whichever
// node is the primary (a multi-host URL with target_session_attrs); each
// fault (Switchover, CrashPrimary, KillPrimary) returns once a primary
// accepts writes again; Stop leaves no process behind, the PostgreSQL
// servers whose Patroni was killed included, and Start stops those a test
// binary that died left behind. Each node's replication connection to the
// other goes through a proxy in this process, which HoldReplication stops
// forwarding: the standby then falls behind on purpose, not by timing.
package hapg

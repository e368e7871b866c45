// Package natsauth gives every process that connects to NATS an identity of
// its own, with the least privilege the topology of package streams allows
// it: NATS's decentralized JWT authentication, one operator, one account
// for the saga (with JetStream) and the system account, and a user JWT per
// identity whose permissions are streams.Topology.Permissions.
//
// An Authority holds the operator's and the accounts' keys. It renders the
// server's configuration (operator, system account, the accounts preloaded
// in a memory resolver), which names no user: the permissions travel in the
// users' JWTs, signed by the account, so no list in a configuration file can
// drift from the topology. Credentials (a .creds file: the user JWT and its
// seed) are issued from it and handed to each process through NATS_CREDS;
// an anonymous connection is refused.
//
// Options turns a process's NATS settings (credentials, a CA for tls://
// URLs) into nats.go options.
package natsauth

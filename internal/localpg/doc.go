// Package localpg runs a throwaway PostgreSQL cluster from the local
// installation: initdb into a directory, then the postgres server as a child
// process listening on 127.0.0.1. Tests use it when no Docker engine or
// TEST_DATABASE_URL is at hand, and `onceflow dev` uses it as its database.
//
// The server is tied to the calling process: it runs in its own process
// group (a terminal's Ctrl-C reaches only the parent, which shuts it down in
// order) and the kernel kills it if the parent dies, so a crashed test binary
// leaves no server behind. Its temporary directory records the process that
// created it; the next Start removes the directories whose creator is gone.
// When the caller is root, initdb and postgres run as the "postgres" OS
// user, since PostgreSQL refuses to run as root.
//
// A cluster started with Durable false trades crash safety for speed (fsync,
// synchronous_commit and full_page_writes off): a server crash is survived,
// an operating-system crash is not. That is the right trade for tests and
// never for data anyone wants to keep.
package localpg

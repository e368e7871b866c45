// Package scaffold generates a new onceflow service — `onceflow new service
// NAME [--consumes EVENT...]` — following docs/new-service.md exactly: its
// package (doc.go, config.go, run.go, NAME.go with a handler per consumed
// event wired through the inbox, http.go and openapi.yaml, tests on the real
// servers), its migrations and sqlc queries with their sqlc.yaml entry and
// the generated code, its compose service, and its entry in
// internal/registry, which gives it its command and its place in onceflow
// dev.
//
// The files are rendered with text/template from the templates beside this
// file (embedded). Existing files are changed as little as possible: the
// sqlc entry, the compose service and the Prometheus target are appended,
// the service's database password is added to postgres's environment, and
// the registry is re-rendered from its own template.
//
// Guarantees: a name that is not a lowercase Go identifier, or that any
// part of the repository already uses, is refused before anything is
// written. Everything is rendered, and sqlc run, in a staging directory
// inside the repository; only then is it moved into place, and a failure
// while moving undoes the moves made. A failed generation changes nothing.
package scaffold

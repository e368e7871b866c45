// Package registry is the list of onceflow's services: the one place a
// service is registered so that it gets its command (onceflow NAME), a place
// in onceflow dev (its database, its port, its readiness wait) and in
// onceflow migrate.
//
// registry.go is rendered by `onceflow new service` from the template
// internal/scaffold/templates/registry.go.tmpl, with one service more each
// time; a test keeps the file and the template identical, so add a service
// with the command (or by editing both).
package registry

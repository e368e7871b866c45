// Package postgres opens connection pools and migrates service databases.
//
// A database's Schema is an ordered list of migration sets (the platform set
// first, then the service's own); each set is applied with goose and
// versioned in its own table, under a PostgreSQL advisory lock so that
// replicas starting together do not race each other.
package postgres

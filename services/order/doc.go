// Package order owns orders and their saga state. POST /orders writes the
// order (PENDING) and an OrderPlaced outbox row in one transaction; the
// payment and stock events move it to PAID, CONFIRMED, REJECTED or CANCELLED.
//
// Its database schema is db/migrations/order; its handlers and HTTP API
// arrive with the services issue.
package order

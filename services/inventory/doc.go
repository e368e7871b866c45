// Package inventory owns stock. On PaymentDebited it reserves every line of
// the order or none, and emits StockReserved or StockRejected; stock never
// goes negative.
//
// Its database schema is db/migrations/inventory; its handlers and HTTP API
// arrive with the services issue.
package inventory

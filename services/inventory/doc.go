// Package inventory owns stock.
//
// On PaymentDebited it reserves every line of the order or none, and emits
// StockReserved or StockRejected (an unknown SKU or a short line refuses the
// whole order; the rejection carries the debited amount so that payment can
// refund it). Refusing stock is an outcome, not an error: it is recorded and
// never retried.
//
// One reservation row per order (its primary key) is the decision: a second
// PaymentDebited for the same order, even under a new event id, finds it and
// changes nothing; the inbox makes each event's effect happen once. Stock
// never goes negative (a CHECK and a conditional UPDATE), and an order's
// stock rows are locked in SKU order, so that concurrent orders over
// overlapping SKUs cannot deadlock.
//
// Over HTTP, GET /stock/{sku} reads a SKU's level. Stock is a ledger: an
// operator receives goods (POST /stock/{sku}/receipts) and corrects levels
// by a signed delta with a reason (POST /stock/{sku}/adjustments), both
// under an Idempotency-Key, so that a retry applies once; a stock count
// (PUT /stock/{sku}) sets a level only if the version it counted (If-Match)
// is still current, so that it cannot undo a reservation made since. Each
// writes a stock movement in its transaction: available + reserved = the
// sum of a SKU's movements, which the auditor checks.
//
// Read inventory.go first: its handlers are the pattern, one event on the inbox's
// transaction. batch.go is an optional optimisation, to read last: the
// set-based forms of HandlePaymentDebited (inbox.BatchHandler), which the inbox
// uses for a batch of new events and falls back from to the per-event
// handlers on any error; CONSUMER_SET_BASED=false turns them off.
package inventory

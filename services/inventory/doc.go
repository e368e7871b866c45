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
// Over HTTP, PUT /stock/{sku} sets a SKU's available level and GET reads it.
package inventory

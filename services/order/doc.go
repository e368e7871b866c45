// Package order owns orders and their saga state.
//
// POST /orders writes the order (PENDING), its lines and an OrderPlaced
// outbox row in one transaction, under the request's Idempotency-Key, so a
// retried request places the order once. The order's e-mails go to the
// token's verified e-mail only: customer_email may repeat it or be left
// out, any other address is a 422 (see recipient in http.go). Each caller
// may place ORDER_RATE_LIMIT orders a second (ORDER_RATE_BURST at once);
// more are a 429 with Retry-After. The payment and stock events then
// move it to PAID, CONFIRMED, REJECTED or CANCELLED; on reaching a terminal
// state it emits OrderConfirmed, OrderRejected or OrderCancelled in the same
// transaction.
//
// Events may arrive late, twice or out of order (a StockReserved can be
// processed before the PaymentDebited it follows). Each handler locks the
// order row first, so events of one order apply one at a time; transitions
// only ever move forward (PENDING < PAID < a terminal state) and never out of
// a terminal state, so a terminal event is emitted exactly once; and every
// event is recorded once in the order's timeline, whether or not it changed
// the status.
//
// Every order carries a deadline, placement time plus ORDER_DEADLINE,
// stored with it. The Expirer (expirer.go) ends an order still PENDING or
// PAID past it: EXPIRED and an OrderExpired in the outbox, in one
// transaction, once, however many replicas run it. A reply that finds its
// order terminal is recorded in the timeline as late, with its fate
// (docs/saga.md): a debit after expiry is refunded and a reservation
// released by the participants' OrderExpired handlers; nothing else changes.
//
// Read order.go first: its handlers are the pattern, one event on the
// inbox's transaction. batch.go is an optional optimisation, to read last:
// the set-based forms of its subscriptions' handlers (inbox.BatchHandler),
// which the inbox uses for a batch of new events and falls back from to the
// per-event handlers on any error; CONSUMER_SET_BASED=false turns them off.
package order

// Package payment owns wallets and payments.
//
// On OrderPlaced it debits the customer's wallet and emits PaymentDebited, or
// records the refusal and emits PaymentRejected (insufficient funds is an
// outcome, not an error: it is never retried). On StockRejected it refunds
// the debit once and emits PaymentRefunded — the saga's compensation step.
//
// One payment row per order (its primary key) makes a second debit
// impossible even if an event were re-emitted under a new id; the inbox makes
// each event's effect happen once. A balance never goes negative (a CHECK
// and a conditional UPDATE) and a refund never exceeds its debit.
//
// Read payment.go first: its handlers are the pattern, one event on the inbox's
// transaction. batch.go is an optional optimisation, to read last: the
// set-based forms of HandleOrderPlaced and HandleStockRejected (inbox.BatchHandler), which the inbox
// uses for a batch of new events and falls back from to the per-event
// handlers on any error; CONSUMER_SET_BASED=false turns them off.
package payment

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
package payment

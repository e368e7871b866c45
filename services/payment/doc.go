// Package payment owns wallets and payments. On OrderPlaced it debits the
// customer's wallet and emits PaymentDebited, or emits PaymentRejected; on
// StockRejected it refunds once and emits PaymentRefunded.
//
// Its database schema is db/migrations/payment; its handlers and HTTP API
// arrive with the services issue.
package payment

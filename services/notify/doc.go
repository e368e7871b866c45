// Package notify owns notifications: one e-mail per (order, milestone).
//
// It consumes the order milestones — OrderPlaced, OrderConfirmed,
// OrderRejected, OrderCancelled and OrderExpired, on the notify-orders durable of the
// ORDERS stream — and for each writes one row to the notifications table,
// its own mail outbox, in the same transaction as the event's inbox row. A
// Mailer then sends that outbox, over SMTP when SMTP_ADDR is set (Mailpit in
// the compose demo) and to the log otherwise, a batch per transaction and a
// few e-mails at once, and keeps each e-mail's state: PENDING, SENT, or
// FAILED after MAILER_MAX_ATTEMPTS attempts with a doubling backoff.
//
// The recipient is the order's customer_email, or, for a customer without
// one, "<customer_id>@example.invalid": the .invalid TLD is reserved by
// RFC 2606, so such an e-mail can be looked at in a catcher and is never
// delivered anywhere. An address that does not parse is recorded as FAILED
// at once, with the reason, so the milestone still has its row.
//
// Guarantees and the honest limit of an external side effect:
//
//   - Never a second e-mail from a duplicate event: the inbox drops a
//     redelivered event, and the unique keys (order_id, kind) and event_id
//     drop a milestone re-emitted under a new event id.
//   - At-least-once delivery to the mail server: an e-mail is marked SENT
//     only after the server accepted it, in the transaction that claimed it.
//     A crash between the server's acceptance and that commit sends the
//     e-mail again, with the same Message-ID ("<event-id@onceflow>"), so the
//     resend is recognisable downstream; one transaction per batch bounds
//     this to the batch in hand (MAILER_BATCH_SIZE e-mails).
//
// Read notify.go first: its handlers are the pattern, one event on the inbox's
// transaction. batch.go is an optional optimisation, to read last: the
// set-based forms of HandleOrderMilestone (inbox.BatchHandler), which the inbox
// uses for a batch of new events and falls back from to the per-event
// handlers on any error; CONSUMER_SET_BASED=false turns them off.
package notify

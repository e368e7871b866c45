// Package notify owns notifications: one e-mail per (order, milestone),
// written to its own outbox in the same transaction as the inbox row of the
// event that caused it, and sent by a mailer with a Message-ID derived from
// the event id.
//
// Its database schema is db/migrations/notify; its handlers and HTTP API
// arrive with the services issue.
package notify

package notify

import (
	"context"
	"fmt"
	"net/mail"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/services/notify/internal/dbsqlc"
)

// Notification kinds: the order milestones that each get one e-mail.
const (
	KindPlaced    = "placed"
	KindConfirmed = "confirmed"
	KindRejected  = "rejected"
	KindCancelled = "cancelled"
)

// Notification statuses, as stored.
const (
	StatusPending = "PENDING"
	StatusSent    = "SENT"
	StatusFailed  = "FAILED"
)

// PlaceholderDomain is the domain of the recipient of a customer without an
// e-mail address: "<customer_id>@example.invalid". The .invalid TLD is
// reserved by RFC 2606 and never resolves, so such an e-mail is accepted by
// a catch-all relay like Mailpit and delivered nowhere else.
const PlaceholderDomain = "example.invalid"

// Service is the notify service's behaviour: its event handlers and HTTP API.
// The e-mails it writes are sent by a Mailer.
type Service struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
}

// New returns the service on its database.
func New(pool *pgxpool.Pool) *Service {
	return &Service{pool: pool, queries: dbsqlc.New()}
}

// HandleOrderMilestone is the handler of the notify-orders subscription,
// which receives every event on orders.>: it dispatches each order milestone
// to its handler.
func (s *Service) HandleOrderMilestone(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	switch ev.Type {
	case event.OrderPlaced:
		return s.HandleOrderPlaced(ctx, tx, ev)
	case event.OrderConfirmed:
		return s.HandleOrderConfirmed(ctx, tx, ev)
	case event.OrderRejected:
		return s.HandleOrderRejected(ctx, tx, ev)
	case event.OrderCancelled:
		return s.HandleOrderCancelled(ctx, tx, ev)
	}
	return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
}

// HandleOrderPlaced writes the "placed" e-mail of the order.
func (s *Service) HandleOrderPlaced(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderPlaced {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderPlacedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	return s.write(ctx, tx, ev, p.Order, KindPlaced,
		fmt.Sprintf("We received your order %s", p.OrderID),
		fmt.Sprintf("We received your order %s (total %s).\nWe will write again once it is paid and the goods are reserved.\n",
			p.OrderID, amount(p.TotalCents)))
}

// HandleOrderConfirmed writes the "confirmed" e-mail of the order.
func (s *Service) HandleOrderConfirmed(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderConfirmed {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderConfirmedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	return s.write(ctx, tx, ev, p.Order, KindConfirmed,
		fmt.Sprintf("Your order %s is confirmed", p.OrderID),
		fmt.Sprintf("Your order %s is confirmed: it is paid (total %s) and the goods are reserved for you.\n",
			p.OrderID, amount(p.TotalCents)))
}

// HandleOrderRejected writes the "rejected" e-mail of the order.
func (s *Service) HandleOrderRejected(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderRejected {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderRejectedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	return s.write(ctx, tx, ev, p.Order, KindRejected,
		fmt.Sprintf("Your order %s was rejected", p.OrderID),
		fmt.Sprintf("Your order %s could not be paid%s.\nNothing was charged.\n", p.OrderID, because(p.Reason)))
}

// HandleOrderCancelled writes the "cancelled" e-mail of the order.
func (s *Service) HandleOrderCancelled(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	if ev.Type != event.OrderCancelled {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	var p event.OrderCancelledV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	return s.write(ctx, tx, ev, p.Order, KindCancelled,
		fmt.Sprintf("Your order %s was cancelled", p.OrderID),
		fmt.Sprintf("Your order %s was cancelled%s.\nYour payment has been refunded in full.\n", p.OrderID, because(p.Reason)))
}

// write records the e-mail of one milestone of an order, unless the
// milestone or the event already has one: the inbox drops a redelivered
// event, and the unique keys also drop the same milestone re-emitted under a
// new event id, so that a customer never gets a milestone's e-mail twice.
func (s *Service) write(ctx context.Context, tx pgx.Tx, ev event.Envelope, o event.Order, kind, subject, body string) error {
	recipient := Recipient(o)
	status, lastError := StatusPending, ""
	// An address no mail server would take is recorded as FAILED rather
	// than dead-lettered, so the milestone still has its one row and the
	// reason can be read from it.
	if addr, err := mail.ParseAddress(recipient); err != nil {
		status, lastError = StatusFailed, fmt.Sprintf("invalid recipient %q: %v", recipient, err)
	} else {
		recipient = addr.Address
	}
	if _, err := s.queries.InsertNotification(ctx, tx, dbsqlc.InsertNotificationParams{
		OrderID:   o.OrderID,
		Kind:      kind,
		Recipient: recipient,
		EventID:   ev.ID,
		MessageID: MessageID(ev),
		Subject:   subject,
		Body:      body,
		Status:    status,
		LastError: lastError,
	}); err != nil {
		return fmt.Errorf("write %s notification of order %s: %w", kind, o.OrderID, err)
	}
	return nil
}

// Recipient is where the e-mails about o go: the customer's e-mail address,
// or "<customer_id>@example.invalid" when the order has none.
func Recipient(o event.Order) string {
	if o.CustomerEmail != "" {
		return o.CustomerEmail
	}
	return o.CustomerID + "@" + PlaceholderDomain
}

// MessageID is the Message-ID of the e-mail that ev caused: derived from the
// event id, so that a resend after a crash carries the same id and the mail
// server or the reader can recognise it.
func MessageID(ev event.Envelope) string {
	return "<" + ev.ID.String() + "@onceflow>"
}

// amount formats cents as units with two decimals.
func amount(cents int64) string {
	sign, u := "", uint64(cents)
	if cents < 0 {
		sign, u = "-", -u // wraps to the magnitude, math.MinInt64 included
	}
	return fmt.Sprintf("%s%d.%02d", sign, u/100, u%100)
}

func because(reason string) string {
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return ""
	}
	return " (" + reason + ")"
}

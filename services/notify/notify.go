package notify

import (
	"context"
	"fmt"
	"net/mail"
	"strings"
	"time"

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
	KindExpired   = "expired"
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
// which receives every event on orders.>: it writes the e-mail of each order
// milestone.
func (s *Service) HandleOrderMilestone(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.write(ctx, tx, ev)
}

// HandleOrderPlaced writes the "placed" e-mail of the order.
func (s *Service) HandleOrderPlaced(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.writeIf(ctx, tx, ev, event.OrderPlaced)
}

// HandleOrderConfirmed writes the "confirmed" e-mail of the order.
func (s *Service) HandleOrderConfirmed(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.writeIf(ctx, tx, ev, event.OrderConfirmed)
}

// HandleOrderRejected writes the "rejected" e-mail of the order.
func (s *Service) HandleOrderRejected(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.writeIf(ctx, tx, ev, event.OrderRejected)
}

// HandleOrderExpired writes the "expired" e-mail of the order.
func (s *Service) HandleOrderExpired(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.writeIf(ctx, tx, ev, event.OrderExpired)
}

// HandleOrderCancelled writes the "cancelled" e-mail of the order.
func (s *Service) HandleOrderCancelled(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	return s.writeIf(ctx, tx, ev, event.OrderCancelled)
}

// writeIf writes the e-mail of ev, which must be of type typ.
func (s *Service) writeIf(ctx context.Context, tx pgx.Tx, ev event.Envelope, typ event.Type) error {
	if ev.Type != typ {
		return inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}
	return s.write(ctx, tx, ev)
}

// write records the e-mail of one milestone of an order, unless the
// milestone or the event already has one: the inbox drops a redelivered
// event, and the unique keys also drop the same milestone re-emitted under a
// new event id, so that a customer never gets a milestone's e-mail twice.
func (s *Service) write(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	n, err := notification(ev)
	if err != nil {
		return err
	}
	if _, err := s.queries.InsertNotification(ctx, tx, n); err != nil {
		return fmt.Errorf("write %s notification of order %s: %w", n.Kind, n.OrderID, err)
	}
	return nil
}

// notification is the e-mail that the order milestone ev causes, as its
// row: the one place both the per-event and the set-based handler build it.
func notification(ev event.Envelope) (dbsqlc.InsertNotificationParams, error) {
	var (
		o                   event.Order
		kind, subject, body string
	)
	switch ev.Type {
	case event.OrderPlaced:
		var p event.OrderPlacedV1
		if err := ev.Decode(&p); err != nil {
			return dbsqlc.InsertNotificationParams{}, err
		}
		o, kind = p.Order, KindPlaced
		subject = fmt.Sprintf("We received your order %s", p.OrderID)
		body = fmt.Sprintf("We received your order %s (total %s).\nWe will write again once it is paid and the goods are reserved.\n",
			p.OrderID, amount(p.TotalCents))
	case event.OrderConfirmed:
		var p event.OrderConfirmedV1
		if err := ev.Decode(&p); err != nil {
			return dbsqlc.InsertNotificationParams{}, err
		}
		o, kind = p.Order, KindConfirmed
		subject = fmt.Sprintf("Your order %s is confirmed", p.OrderID)
		body = fmt.Sprintf("Your order %s is confirmed: it is paid (total %s) and the goods are reserved for you.\n",
			p.OrderID, amount(p.TotalCents))
	case event.OrderRejected:
		var p event.OrderRejectedV1
		if err := ev.Decode(&p); err != nil {
			return dbsqlc.InsertNotificationParams{}, err
		}
		o, kind = p.Order, KindRejected
		subject = fmt.Sprintf("Your order %s was rejected", p.OrderID)
		body = fmt.Sprintf("Your order %s could not be paid%s.\nNothing was charged.\n", p.OrderID, because(p.Reason))
	case event.OrderCancelled:
		var p event.OrderCancelledV1
		if err := ev.Decode(&p); err != nil {
			return dbsqlc.InsertNotificationParams{}, err
		}
		o, kind = p.Order, KindCancelled
		subject = fmt.Sprintf("Your order %s was cancelled", p.OrderID)
		body = fmt.Sprintf("Your order %s was cancelled%s.\nYour payment has been refunded in full.\n", p.OrderID, because(p.Reason))
	case event.OrderExpired:
		var p event.OrderExpiredV1
		if err := ev.Decode(&p); err != nil {
			return dbsqlc.InsertNotificationParams{}, err
		}
		o, kind = p.Order, KindExpired
		subject = fmt.Sprintf("Your order %s could not be completed in time", p.OrderID)
		body = fmt.Sprintf("Your order %s could not be completed by %s and has been withdrawn.\n"+
			"Anything charged for it is refunded and nothing stays reserved.\n", p.OrderID, p.Deadline.UTC().Format(time.RFC1123))
	default:
		return dbsqlc.InsertNotificationParams{}, inbox.Permanent(fmt.Errorf("unexpected event type %s", ev.Type))
	}

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
	return dbsqlc.InsertNotificationParams{
		OrderID:    o.OrderID,
		CustomerID: o.CustomerID,
		Kind:       kind,
		Recipient:  recipient,
		EventID:    ev.ID,
		MessageID:  MessageID(ev),
		Subject:    subject,
		Body:       body,
		Status:     status,
		LastError:  lastError,
	}, nil
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

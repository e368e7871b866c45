package event

import "fmt"

// Type is a versioned CloudEvents type, e.g. "onceflow.order.placed.v1".
type Type string

// The event types of the order saga.
const (
	OrderPlaced    Type = "onceflow.order.placed.v1"
	OrderConfirmed Type = "onceflow.order.confirmed.v1"
	OrderRejected  Type = "onceflow.order.rejected.v1"
	OrderCancelled Type = "onceflow.order.cancelled.v1"
	// OrderExpired ends an order that was not terminal at its deadline;
	// payment and inventory compensate what they did for it.
	OrderExpired    Type = "onceflow.order.expired.v1"
	PaymentDebited  Type = "onceflow.payment.debited.v1"
	PaymentRejected Type = "onceflow.payment.rejected.v1"
	PaymentRefunded Type = "onceflow.payment.refunded.v1"
	StockReserved   Type = "onceflow.inventory.reserved.v1"
	StockRejected   Type = "onceflow.inventory.rejected.v1"
)

// Types lists every known event type.
func Types() []Type {
	return []Type{
		OrderPlaced, OrderConfirmed, OrderRejected, OrderCancelled, OrderExpired,
		PaymentDebited, PaymentRejected, PaymentRefunded,
		StockReserved, StockRejected,
	}
}

// NATSSubject is the subject the type is published on. Subjects are grouped
// by owning domain ("orders.>", "payments.>", "inventory.>"), one stream each.
func (t Type) NATSSubject() (string, error) {
	switch t {
	case OrderPlaced:
		return "orders.placed.v1", nil
	case OrderConfirmed:
		return "orders.confirmed.v1", nil
	case OrderRejected:
		return "orders.rejected.v1", nil
	case OrderCancelled:
		return "orders.cancelled.v1", nil
	case OrderExpired:
		return "orders.expired.v1", nil
	case PaymentDebited:
		return "payments.debited.v1", nil
	case PaymentRejected:
		return "payments.rejected.v1", nil
	case PaymentRefunded:
		return "payments.refunded.v1", nil
	case StockReserved:
		return "inventory.reserved.v1", nil
	case StockRejected:
		return "inventory.rejected.v1", nil
	}
	return "", fmt.Errorf("%w: unknown type %q", ErrInvalid, string(t))
}

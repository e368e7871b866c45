package event

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
)

// OrderLine is one line of an order, carried by the events that need it.
type OrderLine struct {
	SKU            string `json:"sku"`
	Quantity       int32  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// Lines is an order's lines.
type Lines []OrderLine

// Validate checks that there is at least one line and every line is sane.
func (ls Lines) Validate() error {
	if len(ls) == 0 {
		return errors.New("no lines")
	}
	for i, l := range ls {
		switch {
		case l.SKU == "":
			return fmt.Errorf("line %d: missing sku", i)
		case l.Quantity <= 0:
			return fmt.Errorf("line %d: quantity %d is not positive", i, l.Quantity)
		case l.UnitPriceCents < 0:
			return fmt.Errorf("line %d: negative unit price", i)
		}
	}
	return nil
}

// Total is the sum of quantity × unit price, or an error if it overflows.
func (ls Lines) Total() (int64, error) {
	var total int64
	for i, l := range ls {
		if l.UnitPriceCents != 0 && int64(l.Quantity) > math.MaxInt64/l.UnitPriceCents {
			return 0, fmt.Errorf("line %d: amount overflows", i)
		}
		amount := int64(l.Quantity) * l.UnitPriceCents
		if total > math.MaxInt64-amount {
			return 0, fmt.Errorf("line %d: total overflows", i)
		}
		total += amount
	}
	return total, nil
}

// Order identifies the order and customer an event is about; every saga
// payload embeds it.
type Order struct {
	OrderID       uuid.UUID `json:"order_id"`
	CustomerID    string    `json:"customer_id"`
	CustomerEmail string    `json:"customer_email,omitempty"`
}

// Validate checks the required identifiers.
func (o Order) Validate() error {
	switch {
	case o.OrderID == uuid.Nil:
		return errors.New("missing order_id")
	case o.CustomerID == "":
		return errors.New("missing customer_id")
	}
	return CheckCustomerID(o.CustomerID)
}

// OrderPlacedV1 is the payload of OrderPlaced.
type OrderPlacedV1 struct {
	Order
	Lines      Lines `json:"lines"`
	TotalCents int64 `json:"total_cents"`
}

// Validate checks the order, its lines and that the total matches them.
func (p OrderPlacedV1) Validate() error {
	return validateAmount(p.Order, p.Lines, p.TotalCents)
}

// PaymentDebitedV1 is the payload of PaymentDebited. It carries the lines so
// that inventory needs no other source to reserve stock.
type PaymentDebitedV1 struct {
	Order
	Lines       Lines `json:"lines"`
	AmountCents int64 `json:"amount_cents"`
}

// Validate checks the order, its lines and that the amount matches them.
func (p PaymentDebitedV1) Validate() error {
	return validateAmount(p.Order, p.Lines, p.AmountCents)
}

// PaymentRejectedV1 is the payload of PaymentRejected.
type PaymentRejectedV1 struct {
	Order
	AmountCents int64  `json:"amount_cents"`
	Reason      string `json:"reason"`
}

// Validate checks the order.
func (p PaymentRejectedV1) Validate() error { return p.Order.Validate() }

// PaymentRefundedV1 is the payload of PaymentRefunded.
type PaymentRefundedV1 struct {
	Order
	AmountCents int64 `json:"amount_cents"`
}

// Validate checks the order and the amount.
func (p PaymentRefundedV1) Validate() error {
	if p.AmountCents < 0 {
		return errors.New("negative amount_cents")
	}
	return p.Order.Validate()
}

// StockReservedV1 is the payload of StockReserved.
type StockReservedV1 struct {
	Order
	Lines Lines `json:"lines"`
}

// Validate checks the order and its lines.
func (p StockReservedV1) Validate() error {
	if err := p.Order.Validate(); err != nil {
		return err
	}
	return p.Lines.Validate()
}

// StockRejectedV1 is the payload of StockRejected. AmountCents is what was
// debited for the order and is to be refunded.
type StockRejectedV1 struct {
	Order
	AmountCents int64  `json:"amount_cents"`
	Reason      string `json:"reason"`
}

// Validate checks the order.
func (p StockRejectedV1) Validate() error { return p.Order.Validate() }

// OrderConfirmedV1 is the payload of OrderConfirmed.
type OrderConfirmedV1 struct {
	Order
	TotalCents int64 `json:"total_cents"`
}

// Validate checks the order.
func (p OrderConfirmedV1) Validate() error { return p.Order.Validate() }

// OrderRejectedV1 is the payload of OrderRejected.
type OrderRejectedV1 struct {
	Order
	Reason string `json:"reason"`
}

// Validate checks the order.
func (p OrderRejectedV1) Validate() error { return p.Order.Validate() }

// OrderCancelledV1 is the payload of OrderCancelled.
type OrderCancelledV1 struct {
	Order
	Reason string `json:"reason"`
}

// Validate checks the order.
func (p OrderCancelledV1) Validate() error { return p.Order.Validate() }

// OrderExpiredV1 is the payload of OrderExpired: the order was not terminal
// at its deadline. Status is the one it had then (PENDING or PAID), and
// TotalCents what payment may have debited for it.
type OrderExpiredV1 struct {
	Order
	Deadline   time.Time `json:"deadline"`
	Status     string    `json:"status"`
	TotalCents int64     `json:"total_cents"`
}

// Validate checks the order, the deadline and the total.
func (p OrderExpiredV1) Validate() error {
	switch {
	case p.Deadline.IsZero():
		return errors.New("missing deadline")
	case p.TotalCents < 0:
		return errors.New("negative total_cents")
	}
	return p.Order.Validate()
}

func validateAmount(o Order, lines Lines, amount int64) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if err := lines.Validate(); err != nil {
		return err
	}
	total, err := lines.Total()
	if err != nil {
		return err
	}
	if total != amount {
		return fmt.Errorf("amount %d does not match the lines' total %d", amount, total)
	}
	return nil
}

package audit

import (
	"fmt"
	"time"

	"github.com/onceflow/onceflow/internal/event"
)

// defaultExpiryGrace is how long past its deadline an order may still be
// open before the auditor reports it: the expirer's round and a restart of
// the order service.
const defaultExpiryGrace = 30 * time.Second

// The fates of late replies, as the order service records them
// (docs/saga.md).
const (
	lateRefunded  = "refunded"
	lateReleased  = "released"
	lateUnchanged = "unchanged"
)

// lateFate is the fate a reply of type typ has when it finds its order in
// the terminal status status: the table of docs/saga.md.
func lateFate(status string, typ event.Type) string {
	switch {
	case status == orderExpired && typ == event.PaymentDebited:
		return lateRefunded
	case status == orderExpired && typ == event.StockReserved:
		return lateReleased
	}
	return lateUnchanged
}

// checkDeadlines checks that every saga ends: no order open past its
// deadline plus the grace; an expired order keeps no money (its payment is
// not DEBITED) and holds no stock (its reservation is not RESERVED), and
// payment and inventory have handled its expiry (each has its row); a
// RELEASED reservation or an EXPIRED payment or reservation belongs to an
// expired order; every late reply has the fate the table gives it.
func (f facts) checkDeadlines() Check {
	c := Check{Name: CheckDeadlines, Description: "every saga ends by its deadline, an expired order keeps no money or stock, every late reply has its fate"}
	var expired, overdue int64
	for _, o := range f.snapshot.orders {
		if o.status == orderPending || o.status == orderPaid {
			if o.deadline != nil && f.readAt.After(o.deadline.Add(f.expiryGrace)) {
				overdue++
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is still %s %s after its deadline %s",
					o.id, o.status, f.readAt.Sub(*o.deadline).Round(time.Millisecond), o.deadline.UTC().Format(time.RFC3339Nano)))
			}
			continue
		}
		if o.status != orderExpired {
			continue
		}
		expired++
		switch pay := f.payStatus(o.id); pay {
		case paymentExpired, paymentRejected, paymentRefunded:
		default:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s expired, but its payment is %s", o.id, or(pay)))
		}
		switch res := f.resStatus(o.id); res {
		case stockExpired, stockRejected, stockReleased:
		default:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s expired, but its reservation is %s", o.id, or(res)))
		}
	}
	for _, p := range f.snapshot.payments {
		if o, ok := f.orders[p.orderID]; ok && p.status == paymentExpired && o.status != orderExpired {
			c.Violations = append(c.Violations, fmt.Sprintf("payment of order %s is EXPIRED, but the order is %s", p.orderID, o.status))
		}
	}
	for _, r := range f.snapshot.reservations {
		if o, ok := f.orders[r.orderID]; ok && (r.status == stockExpired || r.status == stockReleased) && o.status != orderExpired {
			c.Violations = append(c.Violations, fmt.Sprintf("reservation of order %s is %s, but the order is %s", r.orderID, r.status, o.status))
		}
	}
	fates := map[string]int64{}
	for _, l := range f.lateReplies {
		fates[l.fate]++
		o, ok := f.orders[l.orderID]
		switch {
		case !ok:
			c.Violations = append(c.Violations, fmt.Sprintf("late %s %s of an unknown order %s", l.eventType, l.eventID, l.orderID))
		case terminalMail(o.status) == "":
			c.Violations = append(c.Violations, fmt.Sprintf("%s %s of order %s is recorded late (%s), but the order is %s", l.eventType, l.eventID, l.orderID, l.fate, o.status))
		case l.fate != lateFate(o.status, l.eventType):
			c.Violations = append(c.Violations, fmt.Sprintf("%s %s of %s order %s is recorded %s, not %s", l.eventType, l.eventID, o.status, l.orderID, l.fate, lateFate(o.status, l.eventType)))
		}
	}
	c.Figures = []Figure{
		{"expired orders", expired},
		{"open past deadline + grace", overdue},
		{"grace", f.expiryGrace.String()},
		{"late replies by fate", fates},
	}
	return c
}

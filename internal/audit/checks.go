package audit

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/event"
)

// Statuses and kinds as the services store them (see the CHECK constraints
// in db/migrations). The auditor reads the databases, not the services'
// packages, so it names them itself; rules_test.go holds its order
// statuses, terminal states and late fates to the order service's.
const (
	orderPending   = "PENDING"
	orderPaid      = "PAID"
	orderConfirmed = "CONFIRMED"
	orderRejected  = "REJECTED"
	orderCancelled = "CANCELLED"
	orderExpired   = "EXPIRED"

	paymentDebited  = "DEBITED"
	paymentRejected = "REJECTED"
	paymentRefunded = "REFUNDED"
	paymentExpired  = "EXPIRED" // the order expired before payment decided

	stockReserved = "RESERVED"
	stockRejected = "REJECTED"
	stockReleased = "RELEASED" // given back when the order expired
	stockExpired  = "EXPIRED"  // the order expired before inventory decided

	mailPlaced    = "placed"
	mailConfirmed = "confirmed"
	mailRejected  = "rejected"
	mailCancelled = "cancelled"
	mailExpired   = "expired"
	mailSent      = "SENT"

	// none stands for a missing payment or reservation in messages.
	none = "none"
)

// terminalMail is the e-mail kind of a terminal order status, or "" for a
// status that is not terminal.
func terminalMail(status string) string {
	switch status {
	case orderConfirmed:
		return mailConfirmed
	case orderRejected:
		return mailRejected
	case orderCancelled:
		return mailCancelled
	case orderExpired:
		return mailExpired
	}
	return ""
}

// impliedStatus is the order status that a payment and a reservation status
// ("" for none) stand for; ok is false when they contradict each other.
func impliedStatus(pay, res string) (status string, ok bool) {
	switch {
	case pay == "" && res == "":
		return orderPending, true
	case pay == paymentRejected && res == "":
		return orderRejected, true
	case pay == paymentDebited && res == "":
		return orderPaid, true
	case pay == paymentDebited && res == stockReserved:
		return orderConfirmed, true
	case pay == paymentDebited && res == stockRejected:
		return orderPaid, true // its refund is due
	case pay == paymentRefunded && res == stockRejected:
		return orderCancelled, true
	}
	return "", false
}

// facts indexes a snapshot by order.
type facts struct {
	*snapshot
	orders       map[uuid.UUID]order
	payments     map[uuid.UUID]payment
	reservations map[uuid.UUID]reservation
}

// checks runs every check on s.
func (s *snapshot) checks() []Check {
	f := facts{
		snapshot:     s,
		orders:       make(map[uuid.UUID]order, len(s.orders)),
		payments:     make(map[uuid.UUID]payment, len(s.payments)),
		reservations: make(map[uuid.UUID]reservation, len(s.reservations)),
	}
	for _, o := range s.orders {
		f.orders[o.id] = o
	}
	for _, p := range s.payments {
		f.payments[p.orderID] = p
	}
	for _, r := range s.reservations {
		f.reservations[r.orderID] = r
	}
	return []Check{
		f.checkDebits(),
		f.checkRefunds(),
		f.checkMoney(),
		f.checkStock(),
		f.checkReservations(),
		f.checkOrders(),
		f.checkDeadlines(),
		f.checkEvents(),
		f.checkOutbox(),
		f.checkConsumers(),
		f.checkNotifications(),
	}
}

// payStatus and resStatus are the status of the order's payment and
// reservation, "" for none.
func (f facts) payStatus(id uuid.UUID) string { return f.payments[id].status }
func (f facts) resStatus(id uuid.UUID) string { return f.reservations[id].status }

func or(s string) string {
	if s == "" {
		return none
	}
	return s
}

func (f facts) checkDebits() Check {
	c := Check{Name: CheckDebits, Description: "each order paid at most once, for its total, as its status says"}
	byStatus := map[string]int64{}
	for _, p := range f.payments {
		byStatus[p.status]++
	}
	c.Figures = []Figure{
		{"payments by status", byStatus},
		// The payments table's primary key is the order id: a second
		// payment, let alone a second debit, cannot be stored.
		{"payments per order", "at most 1 (payments primary key)"},
	}
	for _, o := range f.snapshot.orders {
		p, paid := f.payments[o.id]
		switch o.status {
		case orderPaid, orderConfirmed, orderCancelled:
			switch {
			case !paid:
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s without a payment", o.id, o.status))
			case p.status != paymentDebited && p.status != paymentRefunded:
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s but its payment is %s", o.id, o.status, p.status))
			}
		case orderRejected:
			if paid && p.status != paymentRejected {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is REJECTED but its payment is %s", o.id, p.status))
			}
		}
		if !paid {
			continue
		}
		if p.amountCents != o.totalCents {
			c.Violations = append(c.Violations, fmt.Sprintf("payment of order %s is %d cents, the order's total %d", o.id, p.amountCents, o.totalCents))
		}
		if p.customerID != o.customerID {
			c.Violations = append(c.Violations, fmt.Sprintf("payment of order %s is from %q, the order's customer is %q", o.id, p.customerID, o.customerID))
		}
	}
	for _, p := range f.snapshot.payments {
		if _, ok := f.orders[p.orderID]; !ok {
			c.Violations = append(c.Violations, fmt.Sprintf("payment %s of %q (%d cents) is for an unknown order %s", p.status, p.customerID, p.amountCents, p.orderID))
		}
	}
	return c
}

func (f facts) checkRefunds() Check {
	c := Check{Name: CheckRefunds, Description: "a payment is refunded if and only if inventory rejected the order's stock or the order expired"}
	var refunds, refundedCents, rejections int64
	for _, p := range f.snapshot.payments {
		if p.status != paymentRefunded {
			continue
		}
		refunds++
		refundedCents += p.amountCents
		if r := f.resStatus(p.orderID); r != stockRejected && f.orders[p.orderID].status != orderExpired {
			c.Violations = append(c.Violations, fmt.Sprintf("payment of order %s is REFUNDED without a StockRejected or an expiry (reservation: %s)", p.orderID, or(r)))
		}
	}
	for _, r := range f.snapshot.reservations {
		if r.status != stockRejected {
			continue
		}
		rejections++
		if p := f.payStatus(r.orderID); p != paymentRefunded {
			c.Violations = append(c.Violations, fmt.Sprintf("stock of order %s was rejected but its payment is %s, not refunded", r.orderID, or(p)))
		}
	}
	c.Figures = []Figure{
		{"refunds", refunds},
		{"refunded cents", refundedCents},
		{"stock rejections", rejections},
		// MarkRefunded only turns a DEBITED payment REFUNDED, and refunds
		// its own amount: the money check sees a refund that did not.
		{"refund of a debit", "structural (only a DEBITED payment becomes REFUNDED, for its amount)"},
	}
	return c
}

func (f facts) checkMoney() Check {
	c := Check{Name: CheckMoney, Description: "money is conserved: wallet balances + debited (not refunded) payments = credits"}
	debited := map[string]int64{}
	var balances, credited, debitedCents, refundedCents int64
	for _, p := range f.snapshot.payments {
		switch p.status {
		case paymentDebited:
			debited[p.customerID] += p.amountCents
			debitedCents += p.amountCents
		case paymentRefunded:
			refundedCents += p.amountCents
		}
	}
	for _, w := range f.wallets {
		balances += w.balanceCents
		credited += w.creditedCents
		if got := w.balanceCents + debited[w.customerID]; got != w.creditedCents {
			c.Violations = append(c.Violations, fmt.Sprintf("wallet %q: balance %d + debited %d = %d cents, but its credits sum to %d (%+d)",
				w.customerID, w.balanceCents, debited[w.customerID], got, w.creditedCents, got-w.creditedCents))
		}
		delete(debited, w.customerID)
	}
	for _, customer := range slices.Sorted(maps.Keys(debited)) {
		c.Violations = append(c.Violations, fmt.Sprintf("%q has %d cents debited and no wallet", customer, debited[customer]))
	}
	c.Figures = []Figure{
		{"wallets", int64(len(f.wallets))},
		{"credited cents", credited},
		{"balance cents", balances},
		{"debited cents (not refunded)", debitedCents},
		{"refunded cents", refundedCents},
		{"balances + debited - credited", balances + debitedCents - credited},
	}
	return c
}

func (f facts) checkStock() Check {
	c := Check{Name: CheckStock, Description: "stock is conserved: no level negative, available + reserved = the ledger's movements, per SKU"}
	reserved := map[string]int64{}
	for _, r := range f.snapshot.reservations {
		if r.status == stockReleased {
			continue // its lines are the record of what it gave back
		}
		for sku, q := range r.lines {
			reserved[sku] += q
		}
	}
	// Stray lines took their units too, as far as the stock can tell (the
	// reservations check reports them).
	for _, lines := range f.snapshot.strayLines {
		for sku, q := range lines {
			reserved[sku] += q
		}
	}
	var units, ledger int64
	low := -1 // index of the lowest level
	for i, s := range f.stock {
		units += s.available
		ledger += s.ledger
		if low < 0 || s.available < f.stock[low].available {
			low = i
		}
		if s.available < 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("sku %q has %d available", s.sku, s.available))
		}
		if got := s.available + reserved[s.sku]; got != s.ledger {
			c.Violations = append(c.Violations, fmt.Sprintf("sku %q: available %d + reserved %d = %d, but its movements add up to %d (%+d)",
				s.sku, s.available, reserved[s.sku], got, s.ledger, got-s.ledger))
		}
	}
	c.Figures = []Figure{
		{"skus", int64(len(f.stock))},
		{"units available", units},
		{"units in the ledger", ledger},
	}
	if low >= 0 {
		c.Figures = append(c.Figures, Figure{"lowest level", fmt.Sprintf("%d (%s)", f.stock[low].available, f.stock[low].sku)})
	}
	return c
}

func (f facts) checkReservations() Check {
	c := Check{Name: CheckReservations, Description: "inventory reserved for each order exactly what it ordered, on known SKUs"}
	byStatus := map[string]int64{}
	var units int64
	skus := make(map[string]bool, len(f.stock))
	for _, s := range f.stock {
		skus[s.sku] = true
	}
	for _, r := range f.snapshot.reservations {
		byStatus[r.status]++
		for _, q := range r.lines {
			units += q
		}
		o, known := f.orders[r.orderID]
		switch {
		case !known:
			c.Violations = append(c.Violations, fmt.Sprintf("reservation %s for an unknown order %s", r.status, r.orderID))
		case (r.status == stockReserved || r.status == stockReleased) && !maps.Equal(r.lines, o.lines):
			c.Violations = append(c.Violations, fmt.Sprintf("order %s: reserved %s, ordered %s", r.orderID, formatLines(r.lines), formatLines(o.lines)))
		case (r.status == stockRejected || r.status == stockExpired) && len(r.lines) > 0:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s: reservation %s, yet %s reserved", r.orderID, r.status, formatLines(r.lines)))
		}
		for _, sku := range slices.Sorted(maps.Keys(r.lines)) {
			if !skus[sku] {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s: reserved %d of sku %q, which has no stock row", r.orderID, r.lines[sku], sku))
			}
		}
	}
	for _, id := range slices.SortedFunc(maps.Keys(f.snapshot.strayLines), func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }) {
		c.Violations = append(c.Violations, fmt.Sprintf("order %s: %s reserved without a reservation", id, formatLines(f.snapshot.strayLines[id])))
	}
	c.Figures = []Figure{
		{"reservations by status", byStatus},
		{"units reserved", units},
	}
	return c
}

func formatLines(lines map[string]int64) string {
	if len(lines) == 0 {
		return "nothing"
	}
	parts := make([]string, 0, len(lines))
	for _, sku := range slices.Sorted(maps.Keys(lines)) {
		parts = append(parts, fmt.Sprintf("%d %s", lines[sku], sku))
	}
	return strings.Join(parts, ", ")
}

func (f facts) checkOrders() Check {
	c := Check{Name: CheckOrders, Description: "every order is terminal, with the status its payment and reservation imply"}
	byStatus := map[string]int64{}
	for _, o := range f.snapshot.orders {
		byStatus[o.status]++
		if o.status == orderExpired {
			continue // what its payment and reservation must be: checkDeadlines
		}
		pay, res := f.payStatus(o.id), f.resStatus(o.id)
		implied, ok := impliedStatus(pay, res)
		switch {
		case !ok:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s, but payment %s and reservation %s contradict each other", o.id, o.status, or(pay), or(res)))
		case o.status != implied:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s, but payment %s and reservation %s make it %s", o.id, o.status, or(pay), or(res), implied))
		case terminalMail(o.status) == "":
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is still %s (payment %s, reservation %s)", o.id, o.status, or(pay), or(res)))
		}
	}
	c.Figures = []Figure{
		{"orders", int64(len(f.snapshot.orders))},
		{"orders by status", byStatus},
	}
	return c
}

// terminalEvents are the order statuses of the terminal events' types.
var terminalEvents = map[event.Type]string{
	event.OrderConfirmed: orderConfirmed,
	event.OrderRejected:  orderRejected,
	event.OrderCancelled: orderCancelled,
	event.OrderExpired:   orderExpired,
}

func (f facts) checkEvents() Check {
	c := Check{Name: CheckEvents, Description: "per order, no event type on the streams under two ids, and one terminal event, the one of its status"}
	if f.events == nil {
		c.Figures = []Figure{{"not verified", "a saga stream holds too many messages to read one by one"}}
		return c
	}
	byType := map[string]int64{}
	for _, id := range slices.SortedFunc(maps.Keys(f.events), func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }) {
		var terminal []string
		for _, t := range event.Types() {
			ids := f.events[id][t]
			if len(ids) == 0 {
				continue
			}
			byType[string(t)] += int64(len(ids))
			if _, ok := terminalEvents[t]; ok {
				for _, e := range ids {
					terminal = append(terminal, fmt.Sprintf("%s %s", terminalEvents[t], e))
				}
			} else if len(ids) > 1 {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s has %d %s events with different ids: %s", id, len(ids), t, joinIDs(ids)))
			}
		}
		if len(terminal) > 1 {
			c.Violations = append(c.Violations, fmt.Sprintf("order %s has %d terminal events: %s", id, len(terminal), strings.Join(terminal, ", ")))
		}
	}
	for _, o := range f.snapshot.orders {
		evs := f.events[o.id]
		// An order whose OrderPlaced left the stream (its max age) may have
		// lost its other events too.
		if terminalMail(o.status) == "" || len(evs[event.OrderPlaced]) == 0 {
			continue
		}
		var statuses []string
		for t, status := range terminalEvents {
			if len(evs[t]) > 0 {
				statuses = append(statuses, status)
			}
		}
		switch {
		case len(statuses) == 0:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s, but no terminal event of it is on the orders stream", o.id, o.status))
		case len(statuses) == 1 && statuses[0] != o.status:
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s, but its terminal event says %s", o.id, o.status, statuses[0]))
		}
	}
	c.Figures = []Figure{
		{"orders with events", int64(len(f.events))},
		{"events by type", byType},
	}
	return c
}

func joinIDs(ids []uuid.UUID) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id.String()
	}
	return strings.Join(parts, ", ")
}

func (f facts) checkOutbox() Check {
	c := Check{Name: CheckOutbox, Description: "every outbox row of every service's database is published"}
	for _, ob := range f.outboxes {
		c.Figures = append(c.Figures, Figure{ob.service, map[string]int64{"kept": ob.total, "unsent": ob.unsent}})
		for _, r := range ob.oldestUnsent {
			c.Violations = append(c.Violations, fmt.Sprintf("%s outbox row %d (%s %s of %s) unsent since %s",
				ob.service, r.ID, r.EventType, r.EventID, r.Subject, r.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z")))
		}
		if more := ob.unsent - int64(len(ob.oldestUnsent)); more > 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("%s outbox: %s more unsent", ob.service, plural(int(more), "row")))
		}
	}
	return c
}

func (f facts) checkConsumers() Check {
	c := Check{Name: CheckConsumers, Description: "every event on a stream processed (inbox row) or dead-lettered by each durable subscribed to it"}
	dlq := map[string]int64{}
	for _, cs := range f.consumers {
		name := cs.spec.Durable
		dlq[name] = int64(cs.dlq)
		switch {
		case cs.streamMissing:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: stream %s does not exist", name, cs.spec.Stream))
			continue
		case cs.info == nil:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: no such consumer on %s, so nobody processes %s", name, cs.spec.Stream, strings.Join(cs.filters, ", ")))
			continue
		}
		info := cs.info
		c.Figures = append(c.Figures, Figure{
			Name: fmt.Sprintf("%s (%s %s)", name, cs.spec.Stream, strings.Join(cs.filters, ",")),
			Value: map[string]int64{
				"messages":    int64(cs.messages),
				"last_seq":    int64(cs.lastSeq),
				"ack_floor":   int64(info.AckFloor.Stream),
				"pending":     int64(info.NumPending),
				"unacked":     int64(info.NumAckPending),
				"redelivered": int64(info.NumRedelivered),
				"inbox_rows":  cs.processed,
				"dlq":         int64(cs.dlq),
				"verified":    int64(cs.verified),
				"replays":     int64(cs.replays),
			},
		})
		if !cs.scanned {
			c.Figures = append(c.Figures, Figure{name + " not verified", "its stream or the DLQ holds too many messages to read one by one"})
		}
		if len(cs.reasons) > 0 {
			c.Figures = append(c.Figures, Figure{name + " DLQ reasons", formatReasons(cs.reasons)})
		}
		if info.AckFloor.Stream < cs.lastSeq {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: acked up to stream sequence %d, but the last message it subscribes to is %d",
				name, info.AckFloor.Stream, cs.lastSeq))
		}
		for i, m := range cs.lost {
			if i == maxLostListed {
				c.Violations = append(c.Violations, fmt.Sprintf("%s: %s more acked without an inbox row or a DLQ entry", name, plural(len(cs.lost)-i, "message")))
				break
			}
			id := "no event id"
			if m.eventID != uuid.Nil {
				id = "event " + m.eventID.String()
			}
			c.Violations = append(c.Violations, fmt.Sprintf("%s: message %d of %s (%s, %s) was acked, but it has no inbox row and no DLQ entry: its effect is lost",
				name, m.seq, cs.spec.Stream, m.subject, id))
		}
		if info.NumPending > 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: %s not yet delivered", name, plural(int(info.NumPending), "message")))
		}
		if info.NumAckPending > 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: %s delivered and not acked", name, plural(info.NumAckPending, "message")))
		}
	}
	for durable, n := range f.dlqElsewhere {
		dlq[durable] = int64(n)
	}
	c.Figures = append([]Figure{{"dlq entries", dlq}}, c.Figures...)
	return c
}

const (
	// maxReasons is how many distinct DLQ reasons are shown per consumer.
	maxReasons = 5
	// maxLostListed is how many lost messages are named per consumer.
	maxLostListed = 20
)

func formatReasons(reasons map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(reasons), func(a, b string) int {
		if d := reasons[b] - reasons[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, maxReasons+1)
	for i, k := range keys {
		if i == maxReasons {
			parts = append(parts, fmt.Sprintf("… %d more reasons", len(keys)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%d× %q", reasons[k], k))
	}
	return strings.Join(parts, "; ")
}

func (f facts) checkNotifications() Check {
	c := Check{Name: CheckNotifications, Description: "one e-mail per (order, milestone): placed and the terminal one, all sent"}
	byKind, byStatus := map[string]int64{}, map[string]int64{}
	kinds := make(map[uuid.UUID]map[string]int, len(f.snapshot.orders))
	for _, n := range f.notifications {
		byKind[n.kind]++
		byStatus[n.status]++
		if kinds[n.orderID] == nil {
			kinds[n.orderID] = make(map[string]int)
		}
		kinds[n.orderID][n.kind]++
		if _, ok := f.orders[n.orderID]; !ok {
			c.Violations = append(c.Violations, fmt.Sprintf("e-mail %d (%s) is for an unknown order %s", n.id, n.kind, n.orderID))
		}
		if n.status != mailSent {
			msg := fmt.Sprintf("e-mail %d (%s of order %s) is %s", n.id, n.kind, n.orderID, n.status)
			if n.lastError != "" {
				msg += ": " + n.lastError
			}
			c.Violations = append(c.Violations, msg)
		}
	}
	for _, o := range f.snapshot.orders {
		got := kinds[o.id]
		for _, kind := range slices.Sorted(maps.Keys(got)) {
			if got[kind] > 1 {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s has %d %s e-mails", o.id, got[kind], kind))
			}
		}
		if got[mailPlaced] == 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("order %s has no placed e-mail", o.id))
		}
		var terminal []string
		for _, kind := range []string{mailConfirmed, mailRejected, mailCancelled, mailExpired} {
			if got[kind] > 0 {
				terminal = append(terminal, kind)
			}
		}
		want := terminalMail(o.status)
		if want == "" {
			// A terminal e-mail of an order that is not terminal is the
			// orders check's finding (the order is behind, or was set
			// back); two of them contradict each other whatever the order.
			if len(terminal) > 1 {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s and has %s e-mails", o.id, o.status, strings.Join(terminal, " and ")))
			}
			continue
		}
		if got[want] == 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s without a %s e-mail", o.id, o.status, want))
		}
		for _, kind := range terminal {
			if kind != want {
				c.Violations = append(c.Violations, fmt.Sprintf("order %s is %s but has a %s e-mail", o.id, o.status, kind))
			}
		}
	}
	c.Figures = []Figure{
		{"e-mails by kind", byKind},
		{"e-mails by status", byStatus},
	}
	return c
}

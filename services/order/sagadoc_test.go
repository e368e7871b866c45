package order_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/order"
)

// eventNames are the event types by the names docs/saga.md gives them.
var eventNames = map[string]event.Type{
	"OrderPlaced": event.OrderPlaced, "OrderConfirmed": event.OrderConfirmed,
	"OrderRejected": event.OrderRejected, "OrderCancelled": event.OrderCancelled,
	"OrderExpired": event.OrderExpired, "PaymentDebited": event.PaymentDebited,
	"PaymentRejected": event.PaymentRejected, "PaymentRefunded": event.PaymentRefunded,
	"StockReserved": event.StockReserved, "StockRejected": event.StockRejected,
}

var (
	// "payment (`payment-orders`)": a service and its durable.
	serviceDurable = regexp.MustCompile("^([a-z]+) \\(`([a-z]+-[a-z]+)`\\)")
	// "PENDING or PAID → CONFIRMED".
	transition = regexp.MustCompile(`([A-Z]+(?: or [A-Z]+)*) → ([A-Z]+)`)
	// "REJECTED, `OrderRejected` (order, `order-payments`)".
	becomes  = regexp.MustCompile("^([A-Z]+), `[A-Za-z]+` \\(order, `([a-z]+-[a-z]+)`\\)")
	codeName = regexp.MustCompile("`([A-Za-z-]+)`")
)

// TestTheSagaDocIsTheRules reads docs/saga.md's tables as the rules they
// state and checks them against the code: each durable named is the
// topology's, of that service, filtering the event the table says it
// hears; each transition is NextStatus's; each late reply's fate is
// LateFate's, and the late table has one fate for every terminal status
// and every reply the order service hears. The event types and subjects
// it quotes are the code's too.
func TestTheSagaDocIsTheRules(t *testing.T) {
	t.Parallel()
	require.Len(t, eventNames, len(event.Types()), "eventNames misses an event type")
	raw, err := os.ReadFile("../../docs/saga.md")
	require.NoError(t, err)
	doc := string(raw)
	topo := streams.Saga(streams.Config{})
	hears := func(service, durable string, typ event.Type) {
		t.Helper()
		subject, err := typ.NATSSubject()
		require.NoError(t, err)
		i := slices.IndexFunc(topo.Consumers, func(c streams.Consumer) bool { return c.Durable == durable })
		require.GreaterOrEqual(t, i, 0, "docs/saga.md: %s is no durable of the topology", durable)
		require.Equal(t, service, topo.Consumers[i].Service, "docs/saga.md: the service of %s", durable)
		require.Contains(t, topo.Consumers[i].FilterSubjects, subject, "docs/saga.md: %s does not hear %s", durable, typ)
	}

	var transitions int
	for _, row := range table(t, doc, "| step | service (durable) | on |") {
		m := serviceDurable.FindStringSubmatch(row[1])
		if m == nil {
			continue // placed by a request, not an event
		}
		typ := named(t, row[2])
		hears(m[1], m[2], typ)
		for _, m := range transition.FindAllStringSubmatch(row[3], -1) {
			for _, from := range strings.Split(m[1], " or ") {
				to, ok := order.NextStatus(from, typ)
				require.True(t, ok && to == m[2], "docs/saga.md: %s → %s on %s; NextStatus says %q", from, m[2], typ, to)
				transitions++
			}
		}
	}
	for _, row := range table(t, doc, "| when | service (durable) | writes | emits | order becomes |") {
		emitted := named(t, row[3])
		switch m := becomes.FindStringSubmatch(row[4]); {
		case m != nil:
			hears("order", m[2], emitted)
			to, ok := order.NextStatus(order.StatusPending, emitted)
			require.True(t, ok && to == m[1], "docs/saga.md: %s makes an order %s; NextStatus says %q", emitted, m[1], to)
			transitions++
		case strings.HasPrefix(row[4], "—"):
			for _, s := range statuses() {
				_, ok := order.NextStatus(s, emitted)
				require.False(t, ok, "docs/saga.md: %s moves no order, but NextStatus moves a %s one", emitted, s)
			}
		}
	}
	require.Positive(t, transitions, "docs/saga.md: no transition was read")
	for _, row := range table(t, doc, "| participant | durable | on `OrderExpired` |") {
		hears(row[0], codeName.FindStringSubmatch(row[1])[1], event.OrderExpired)
	}
	checkLateFates(t, doc, topo)
	checkTypesAndSubjects(t, doc)
}

// checkTypesAndSubjects checks each event type (`onceflow.order.expired.v1`)
// and each subject (`orders.expired.v1`) docs/saga.md quotes.
func checkTypesAndSubjects(t *testing.T, doc string) {
	t.Helper()
	subjects := map[string]bool{}
	for _, typ := range event.Types() {
		subject, err := typ.NATSSubject()
		require.NoError(t, err)
		subjects[subject] = true
	}
	quoted := regexp.MustCompile("`((onceflow\\.)?[a-z]+\\.[a-z]+\\.v[0-9]+)`").FindAllStringSubmatch(doc, -1)
	require.NotEmpty(t, quoted, "docs/saga.md quotes no event type or subject")
	for _, m := range quoted {
		if m[2] != "" {
			require.Contains(t, event.Types(), event.Type(m[1]), "docs/saga.md: %s is no event type", m[1])
		} else {
			require.True(t, subjects[m[1]], "docs/saga.md: %s is no event's subject", m[1])
		}
	}
}

// checkLateFates checks the late table against LateFate, and that it gives
// one fate for every terminal status and every reply the order hears.
func checkLateFates(t *testing.T, doc string, topo streams.Topology) {
	t.Helper()
	var replies []event.Type
	for _, c := range topo.Consumers {
		if c.Service != "order" {
			continue
		}
		for _, typ := range event.Types() {
			if subject, _ := typ.NATSSubject(); slices.Contains(c.FilterSubjects, subject) {
				replies = append(replies, typ)
			}
		}
	}
	given := map[string]bool{}
	for _, row := range table(t, doc, "| reply | order is | fate (`late`) |") {
		types := replies
		if row[0] != "any reply" {
			types = []event.Type{named(t, row[0])}
		}
		fate := codeName.FindStringSubmatch(row[2])[1]
		for _, s := range strings.Split(row[1], ", ") {
			for _, typ := range types {
				key := s + " " + string(typ)
				require.False(t, given[key], "docs/saga.md: two fates for %s", key)
				given[key] = true
				require.Equal(t, order.LateFate(s, typ), fate, "docs/saga.md: the fate of %s to a %s order", typ, s)
			}
		}
	}
	for _, s := range statuses() {
		for _, typ := range replies {
			if order.Terminal(s) {
				require.True(t, given[s+" "+string(typ)], "docs/saga.md gives no fate for %s to a %s order", typ, s)
			}
		}
	}
}

func statuses() []string {
	return []string{order.StatusPending, order.StatusPaid, order.StatusConfirmed, order.StatusRejected, order.StatusCancelled, order.StatusExpired}
}

// named is the event type a table cell names first (`PaymentDebited`).
func named(t *testing.T, cell string) event.Type {
	t.Helper()
	m := codeName.FindStringSubmatch(cell)
	require.NotNil(t, m, "docs/saga.md: %q names no event", cell)
	typ, ok := eventNames[m[1]]
	require.True(t, ok, "docs/saga.md: %q is no event type", m[1])
	return typ
}

// table is the body of the Markdown table of doc whose header row starts
// with header: each row's cells, trimmed.
func table(t *testing.T, doc, header string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+header)
	require.True(t, ok, "docs/saga.md has no table %q", header)
	var rows [][]string
	for _, line := range strings.Split(rest, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	require.NotEmpty(t, rows, "docs/saga.md: the table %q has no row", header)
	return rows
}

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// TestForgedEvents acts, under load, as a compromised payment service and a
// compromised provisioner. The server refuses what their identities may not
// publish (another service's events, deleting a stream, any event from the
// provisioner); what the payment service may publish on its own subjects
// but that claims another owner or type is dead-lettered by the inbox with
// its reason, and changes nothing: the auditor and the client's checks find
// no violation.
func TestForgedEvents(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(400))
	var forged []uuid.UUID
	err := d.run(t.Context(), func(ctx context.Context) (err error) {
		if err := d.awaitOrders(ctx, 100); err != nil {
			return err
		}
		o, err := sys.confirmedOrder(ctx)
		if err != nil {
			return err
		}
		if err := sys.refusedEvents(ctx, o); err != nil {
			return err
		}
		forged, err = sys.forgeOnOwnSubjects(ctx, o)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	receivers := int64(len(durablesOf(streams.Payments, "payments.debited.v1")))
	sys.verify(d, expect{dlq: 2 * receivers, exactCounts: true})

	reasons, err := sys.dlqReasons(t.Context())
	if err != nil {
		t.Fatalf("e2e: read the DLQ: %v", err)
	}
	var all []string
	for durable, rs := range reasons {
		for _, r := range rs {
			all = append(all, durable+": "+r)
		}
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{
		`ce-source "order" is not "payment", the owner of onceflow.payment.debited.v1`,
		"type onceflow.inventory.rejected.v1 arrived on payments.debited.v1",
	} {
		if strings.Count(joined, want) != int(receivers) {
			t.Errorf("e2e: want %d DLQ reasons with %q; reasons:\n%s", receivers, want, joined)
		}
	}
	for _, kind := range kinds {
		var n int
		if err := sys.pools[kind].QueryRow(t.Context(), `SELECT count(*) FROM processed_events WHERE event_id = ANY($1)`, forged).Scan(&n); err != nil {
			t.Fatalf("e2e: %s inbox: %v", kind, err)
		}
		if n > 0 {
			t.Errorf("e2e: %s processed %d forged events", kind, n)
		}
	}
}

// forgedOrder is a confirmed order, whose forged events would debit,
// reserve or refund it again.
type forgedOrder struct {
	order event.Order
	total int64
	lines event.Lines
}

func (sys *system) confirmedOrder(ctx context.Context) (forgedOrder, error) {
	var o forgedOrder
	for {
		err := sys.pools["order"].QueryRow(ctx, `SELECT id, customer_id, total_cents FROM orders WHERE status = 'CONFIRMED' LIMIT 1`).
			Scan(&o.order.OrderID, &o.order.CustomerID, &o.total)
		if err == nil {
			break
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return o, fmt.Errorf("no confirmed order: %w", err)
		}
	}
	rows, err := sys.pools["order"].Query(ctx, `SELECT sku, quantity, unit_price_cents FROM order_lines WHERE order_id = $1 ORDER BY line_no`, o.order.OrderID)
	if err != nil {
		return o, err
	}
	defer rows.Close()
	for rows.Next() {
		var l event.OrderLine
		if err := rows.Scan(&l.SKU, &l.Quantity, &l.UnitPriceCents); err != nil {
			return o, err
		}
		o.lines = append(o.lines, l)
	}
	return o, rows.Err()
}

// refusedEvents checks that the server refuses, as permissions violations,
// the payment service's OrderPlaced, OrderConfirmed and StockRejected for o
// and its deleting a stream, and the provisioner's publishing any event.
func (sys *system) refusedEvents(ctx context.Context, o forgedOrder) error {
	payment, err := sys.connectAs("payment")
	if err != nil {
		return err
	}
	defer payment.close()
	provisioner, err := sys.connectAs(streams.Provisioner)
	if err != nil {
		return err
	}
	defer provisioner.close()

	for _, f := range []struct {
		as     *identity
		source string
		typ    event.Type
		data   any
	}{
		{payment, "order", event.OrderPlaced, event.OrderPlacedV1{Order: o.order, Lines: o.lines, TotalCents: o.total}},
		{payment, "order", event.OrderConfirmed, event.OrderConfirmedV1{Order: o.order, TotalCents: o.total}},
		{payment, "inventory", event.StockRejected, event.StockRejectedV1{Order: o.order, AmountCents: o.total, Reason: "forged"}},
		{provisioner, "order", event.OrderPlaced, event.OrderPlacedV1{Order: o.order, Lines: o.lines, TotalCents: o.total}},
		{provisioner, "payment", event.PaymentDebited, event.PaymentDebitedV1{Order: o.order, Lines: o.lines, AmountCents: o.total}},
		{provisioner, "inventory", event.StockReserved, event.StockReservedV1{Order: o.order, Lines: o.lines}},
	} {
		msg, err := forgedMsg(f.source, f.typ, f.data)
		if err != nil {
			return err
		}
		if err := f.as.refused(ctx, msg.Subject, func(ctx context.Context) error {
			_, err := f.as.js.PublishMsg(ctx, msg)
			return err
		}); err != nil {
			return err
		}
		sys.faults.add("refused_publish", 1)
	}
	if err := payment.refused(ctx, "$JS.API.STREAM.DELETE."+streams.Orders, func(ctx context.Context) error {
		return payment.js.DeleteStream(ctx, streams.Orders)
	}); err != nil {
		return err
	}
	sys.faults.add("refused_delete_stream", 1)
	return nil
}

// forgeOnOwnSubjects publishes, as the payment service, on its own subject
// payments.debited.v1, a PaymentDebited whose ce-source is order and a
// StockRejected, and returns their event ids.
func (sys *system) forgeOnOwnSubjects(ctx context.Context, o forgedOrder) ([]uuid.UUID, error) {
	payment, err := sys.connectAs("payment")
	if err != nil {
		return nil, err
	}
	defer payment.close()
	debited, err := forgedMsg("order", event.PaymentDebited, event.PaymentDebitedV1{Order: o.order, Lines: o.lines, AmountCents: o.total})
	if err != nil {
		return nil, err
	}
	rejected, err := forgedMsg("payment", event.StockRejected, event.StockRejectedV1{Order: o.order, AmountCents: o.total, Reason: "forged"})
	if err != nil {
		return nil, err
	}
	rejected.Subject = "payments.debited.v1"
	var ids []uuid.UUID
	for _, msg := range []*nats.Msg{debited, rejected} {
		if _, err := payment.js.PublishMsg(ctx, msg); err != nil {
			return nil, fmt.Errorf("publish on payment's own subject: %w", err)
		}
		ids = append(ids, uuid.MustParse(msg.Header.Get(event.HeaderID)))
		sys.faults.add("forged_owner", 1)
	}
	return ids, nil
}

func forgedMsg(source string, typ event.Type, data any) (*nats.Msg, error) {
	ev, err := event.New(source, typ, uuid.NewString(), data)
	if err != nil {
		return nil, err
	}
	return ev.Msg()
}

// identity is a connection with an identity's credentials that records the
// permissions violations the server reports to it.
type identity struct {
	nc *nats.Conn
	js jetstream.JetStream

	mu         sync.Mutex
	violations []string
}

func (sys *system) connectAs(name string) (*identity, error) {
	id := &identity{}
	nc, err := nats.Connect(sys.nats.url(), append(sys.natsClient(name).Options(name), nats.Name("e2e-"+name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			id.mu.Lock()
			defer id.mu.Unlock()
			id.violations = append(id.violations, err.Error())
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	id.nc = nc
	if id.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return id, nil
}

func (id *identity) close() { id.nc.Close() }

// refused runs do, which must fail, and waits for the server's permissions
// violation on subject.
func (id *identity) refused(ctx context.Context, subject string, do func(context.Context) error) error {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	err := do(dctx)
	cancel()
	if err == nil {
		return fmt.Errorf("%s: accepted, want a permissions violation", subject)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		id.mu.Lock()
		for _, v := range id.violations {
			if strings.Contains(v, "ermissions") && strings.Contains(v, `"`+subject+`"`) {
				id.mu.Unlock()
				return nil
			}
		}
		id.mu.Unlock()
		if !sleepCtx(ctx, 20*time.Millisecond) {
			break
		}
	}
	return fmt.Errorf("%s: failed (%v), but the server reported no permissions violation", subject, err)
}

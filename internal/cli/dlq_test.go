package cli

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/dlq/dlqtest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// debited returns a PaymentDebited event made at.
func debited(t *testing.T, at time.Time) event.Envelope {
	t.Helper()
	order := uuid.New()
	ev, err := event.New("payment", event.PaymentDebited, order.String(), event.PaymentDebitedV1{
		Order:       event.Order{OrderID: order, CustomerID: "alice"},
		AmountCents: 120,
		Lines:       event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 120}},
	})
	require.NoError(t, err)
	ev.Time = at
	return ev
}

func TestDLQCommands(t *testing.T) {
	nt := testenv.NewNATS(t)
	js := nt.JetStream(t)
	ctx := t.Context()
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{Storage: jetstream.MemoryStorage, InboxRetention: time.Hour})))
	t.Setenv("NATS_URL", nt.URL)
	t.Setenv("NATS_CREDS", nt.Client(streams.Operator).Creds)
	t.Setenv("ONCEFLOW_OPERATOR", "ops@example")

	fresh := debited(t, time.Now())
	old := debited(t, time.Now().Add(-2*time.Hour))
	freshID := dlqtest.DeadLetter(t, js, fresh, streams.Payments, streams.InventoryPayments, "decode: something broke")
	oldID := dlqtest.DeadLetter(t, js, old, streams.Payments, streams.InventoryPayments, "failed on each of 10 deliveries")
	fid, oid := strconv.FormatUint(freshID, 10), strconv.FormatUint(oldID, 10)

	stdout, _, err := run(t, "dlq", "list")
	require.NoError(t, err)
	require.Contains(t, stdout, "ID  DEAD-LETTERED")
	require.Regexp(t, fid+` +\S+ +inventory-payments +onceflow.payment.debited.v1 +`+fresh.Subject+` +open +verified +decode: something broke`, stdout)
	stdout, _, err = run(t, "dlq", "list", "--reason", "deliveries", "--json")
	require.NoError(t, err)
	var page dlq.Page
	require.NoError(t, json.Unmarshal([]byte(stdout), &page))
	require.Len(t, page.Entries, 1)
	require.Equal(t, oldID, page.Entries[0].ID)

	stdout, _, err = run(t, "dlq", "show", fid)
	require.NoError(t, err)
	for _, want := range []string{"consumer:", "inventory-payments", "deliveries:", "PAYMENTS sequence 1, subject payments.debited.v1", "check:", "verified: the original is in the stream", "ce-id: " + fresh.ID.String(), `"amount_cents": 120`} {
		require.Contains(t, stdout, want)
	}

	stdout, _, err = run(t, "dlq", "replay", fid)
	require.NoError(t, err)
	require.Contains(t, stdout, "event "+fresh.ID.String()+" replayed to inventory-payments (payments.debited.v1.replay.inventory-payments")
	stdout, _, err = run(t, "dlq", "replay", fid)
	require.Error(t, err)
	require.Contains(t, stdout, "already replayed by ops@example")

	// Past the retention: refused, with why and how to override.
	stdout, _, err = run(t, "dlq", "replay", "--consumer", streams.InventoryPayments, "--since", "1h")
	require.Error(t, err)
	require.Contains(t, stdout, "entry "+oid+": not replayed")
	require.Contains(t, stdout, "beyond inventory-payments's inbox retention of 1h0m0s")
	stdout, _, err = run(t, "dlq", "replay", oid, "--past-retention", "--by", "carol")
	require.NoError(t, err, stdout)

	stdout, _, err = run(t, "dlq", "show", oid)
	require.NoError(t, err)
	require.Contains(t, stdout, "replayed by carol at ")

	// The replays are on the durable's replay subject, the inventory
	// consumer's to fetch; order-payments sees neither, only the originals.
	cons, err := js.Consumer(ctx, streams.Payments, streams.OrderPayments)
	require.NoError(t, err)
	require.Equal(t, uint64(2), cons.CachedInfo().NumPending)
	cons, err = js.Consumer(ctx, streams.Payments, streams.InventoryPayments)
	require.NoError(t, err)
	require.Equal(t, uint64(4), cons.CachedInfo().NumPending)

	// An entry whose original the stream never held: shown as unverified,
	// replayed only with --force.
	msg, err := debited(t, time.Now()).Msg()
	require.NoError(t, err)
	gone := strconv.FormatUint(dlqtest.DeadLetterMsg(t, js, msg, streams.Payments, 99, streams.InventoryPayments, "bad"), 10)
	stdout, _, err = run(t, "dlq", "list", "--status", "open")
	require.NoError(t, err)
	require.Regexp(t, gone+` .* open +unverified +bad`, stdout)
	stdout, _, err = run(t, "dlq", "show", gone)
	require.NoError(t, err)
	require.Contains(t, stdout, "not verifiable: PAYMENTS sequence 99 was never stored")
	stdout, _, err = run(t, "dlq", "replay", gone)
	require.Error(t, err)
	require.Contains(t, stdout, "not verifiable")
	stdout, _, err = run(t, "dlq", "replay", gone, "--force")
	require.NoError(t, err, stdout)
	stdout, _, err = run(t, "dlq", "show", gone)
	require.NoError(t, err)
	require.Contains(t, stdout, "forced: the entry's own copy")

	// One written on notify's DLQ subject naming inventory-payments: not
	// replayed, even forced.
	forged := strconv.FormatUint(dlqtest.Write(t, js, streams.NotifyOrders,
		dlqtest.Headers(msg, streams.Payments, 1, streams.InventoryPayments, "forged"), msg.Data), 10)
	stdout, _, err = run(t, "dlq", "list", "--consumer", streams.NotifyOrders)
	require.NoError(t, err)
	require.Regexp(t, forged+` .* notify-orders .* open +unreplayable +forged`, stdout)
	stdout, _, err = run(t, "dlq", "show", forged)
	require.NoError(t, err)
	require.Contains(t, stdout, `not verifiable and unreplayable, even with --force: it was written on dlq.notify-orders, but its Onceflow-Dlq-Consumer header names "inventory-payments"`)
	stdout, _, err = run(t, "dlq", "replay", forged, "--force")
	require.Error(t, err)
	require.Contains(t, stdout, "unreplayable")

	third := dlqtest.DeadLetter(t, js, debited(t, time.Now()), streams.Payments, streams.InventoryPayments, "bad")
	_, _, err = run(t, "dlq", "discard", strconv.FormatUint(third, 10))
	require.ErrorContains(t, err, "--reason is required")
	stdout, _, err = run(t, "dlq", "discard", strconv.FormatUint(third, 10), "--reason", "refunded by hand")
	require.NoError(t, err)
	require.Contains(t, stdout, "discarded")
	stdout, _, err = run(t, "dlq", "list", "--status", "open")
	require.NoError(t, err)
	require.NotContains(t, stdout, "inventory-payments")

	_, _, err = run(t, "dlq", "replay")
	require.ErrorContains(t, err, "want entry IDs, or --consumer and --since")
	_, _, err = run(t, "dlq", "frobnicate")
	require.Error(t, err)
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// One confirmed order whose every step took a known time, and one that was
// never confirmed: the breakdown shows the first one's steps.
func TestHopsOfAConfirmedOrder(t *testing.T) {
	t.Parallel()
	order, payment, inventory := testenv.NewServiceDatabase(t, ""), testenv.NewServiceDatabase(t, ""), testenv.NewServiceDatabase(t, "")

	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	publish := func(db *testenv.Database, orderID string, typ event.Type, made, sent time.Time) uuid.UUID {
		id := uuid.New()
		_, err := db.Pool.Exec(t.Context(), `WITH o AS (
				INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data, created_at)
				VALUES ($1, $2, 'test', $3, 'test', $4, '{}', $4) RETURNING id, xact_id::text::bigint AS xid)
			INSERT INTO outbox_batch (recorded_at, snap, upto, span_snap, span_upto, span_done, epoch, system_id)
			SELECT $5, s, id, s, id, id, 0, 0 FROM o, CAST(format('%s:%s:', xid + 1, xid + 1) AS pg_snapshot) AS s`, id, string(typ), orderID, made, sent)
		require.NoError(t, err)
		return id
	}
	claim := func(db *testenv.Database, id uuid.UUID, when time.Time) {
		_, err := db.Pool.Exec(t.Context(), `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, processed_at, minted_at)
			VALUES ('test', $1, 'test', $2, 1, $2, uuid7_time($1))`, id, when)
		require.NoError(t, err)
	}

	o := uuid.NewString()
	placed := publish(order, o, event.OrderPlaced, at(0), at(1))
	claim(payment, placed, at(3))
	debited := publish(payment, o, event.PaymentDebited, at(6), at(10))
	claim(inventory, debited, at(15))
	reserved := publish(inventory, o, event.StockReserved, at(21), at(28))
	claim(order, reserved, at(36))
	publish(order, o, event.OrderConfirmed, at(45), at(55))
	// Placed and paid, never confirmed.
	pending := uuid.NewString()
	claim(payment, publish(order, pending, event.OrderPlaced, at(0), at(1)), at(2))

	var out bytes.Buffer
	require.NoError(t, run(t.Context(), databases{order.URL, payment.URL, inventory.URL}, &out))
	t.Log("\n" + out.String())
	require.Contains(t, out.String(), "1 confirmed orders")
	// Each hop took one millisecond more than the one before it.
	for i, name := range hops[:len(hops)-1] {
		ms := float64(i + 1)
		require.Regexp(t, regexp.QuoteMeta(name)+`\s+`+regexp.QuoteMeta(fmt.Sprintf("%.1f", ms)), out.String())
	}
	require.Regexp(t, `total: OrderPlaced made → OrderConfirmed made\s+45\.0`, out.String())
}

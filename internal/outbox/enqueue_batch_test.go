package outbox_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestEnqueueBatchWritesInOrderAsEnqueueDoes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)

	var evs []event.Envelope
	for i := range 40 {
		typ := event.PaymentDebited
		if i%3 == 0 {
			typ = event.PaymentRejected
		}
		ev := newEvent(t, typ, "order-"+string(rune('a'+i%5)), i)
		if i%2 == 0 {
			ev.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		}
		// Key order and spacing that a jsonb column would have rewritten.
		ev.Data = fmt.Appendf(nil, `{"seq":%d, "a":[1,2]}`, i)
		evs = append(evs, ev)
	}
	tx := testenv.Begin(t, f.db.Pool)
	require.NoError(t, outbox.EnqueueBatch(ctx, tx, nil), "an empty batch writes nothing")
	require.NoError(t, outbox.EnqueueBatch(ctx, tx, evs))
	require.NoError(t, tx.Commit(ctx))

	rows, err := f.db.Pool.Query(ctx,
		`SELECT event_id, event_type, source, subject, nats_subject, event_time, data, traceparent FROM outbox ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	i := 0
	for rows.Next() {
		var got event.Envelope
		var typ, natsSubject string
		var data []byte
		require.NoError(t, rows.Scan(&got.ID, &typ, &got.Source, &got.Subject, &natsSubject, &got.Time, &data, &got.TraceParent))
		require.Less(t, i, len(evs))
		want := evs[i]
		require.Equal(t, want.ID, got.ID, "row %d: written in the order of the batch", i)
		require.Equal(t, string(want.Type), typ)
		require.Equal(t, want.Source, got.Source)
		require.Equal(t, want.Subject, got.Subject)
		wantSubject, err := want.Type.NATSSubject()
		require.NoError(t, err)
		require.Equal(t, wantSubject, natsSubject)
		require.WithinDuration(t, want.Time, got.Time, time.Microsecond)
		require.Equal(t, string(want.Data), string(data), "the payload as written")
		require.Equal(t, want.TraceParent, got.TraceParent)
		i++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(evs), i)

	n, err := f.relay(outbox.RelayConfig{BatchSize: 7}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)
	requireStreamHolds(t, f.js, streams.Payments, evs)
}

func TestEnqueueBatchRefusesAnInvalidEventAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)

	tests := []struct {
		name   string
		mutate func(*event.Envelope)
	}{
		{"no subject", func(ev *event.Envelope) { ev.Subject = "" }},
		{"unknown type", func(ev *event.Envelope) { ev.Type = "onceflow.nope.v1" }},
		{"data not JSON", func(ev *event.Envelope) { ev.Data = json.RawMessage("{") }},
	}
	for _, tt := range tests {
		bad := newEvent(t, event.OrderPlaced, "order-1", 2)
		tt.mutate(&bad)
		evs := []event.Envelope{newEvent(t, event.OrderPlaced, "order-1", 1), bad, newEvent(t, event.OrderPlaced, "order-1", 3)}
		tx := testenv.Begin(t, f.db.Pool)
		require.ErrorIs(t, outbox.EnqueueBatch(ctx, tx, evs), event.ErrInvalid, tt.name)
		require.NoError(t, tx.Commit(ctx))
	}
	var rows int
	require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows))
	require.Zero(t, rows)
}

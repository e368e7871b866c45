package event_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
)

func TestEnvelopeRoundTripsThroughNATSMessage(t *testing.T) {
	t.Parallel()
	orderID := uuid.New()
	payload := event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: "alice"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 3, UnitPriceCents: 25}},
		TotalCents: 75,
	}
	env, err := event.New("order", event.OrderPlaced, orderID.String(), payload)
	require.NoError(t, err)
	env.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.Equal(t, 7, int(env.ID.Version()), "event ids are UUIDv7")

	msg, err := env.Msg()
	require.NoError(t, err)
	require.Equal(t, "orders.placed.v1", msg.Subject)
	require.Equal(t, env.ID.String(), msg.Header.Get(jetstream.MsgIDHeader))

	got, err := event.FromMsg(msg.Header, msg.Data)
	require.NoError(t, err)
	require.Equal(t, env.ID, got.ID)
	require.Equal(t, env.Type, got.Type)
	require.Equal(t, env.Subject, got.Subject)
	require.Equal(t, env.TraceParent, got.TraceParent)
	require.True(t, env.Time.Equal(got.Time))

	var decoded event.OrderPlacedV1
	require.NoError(t, got.Decode(&decoded))
	require.Equal(t, payload, decoded)
}

// placed returns a valid OrderPlaced event.
func placed(t *testing.T) event.Envelope {
	t.Helper()
	env, err := event.New("order", event.OrderPlaced, "o1", event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: "c"},
		Lines:      event.Lines{{SKU: "s", Quantity: 1, UnitPriceCents: 1}},
		TotalCents: 1,
	})
	require.NoError(t, err)
	return env
}

func TestInvalidEventsWrapErrInvalid(t *testing.T) {
	t.Parallel()
	msg, err := placed(t).Msg()
	require.NoError(t, err)

	tests := []struct {
		name   string
		mutate func(h map[string][]string) []byte
		decode any
	}{
		{"no specversion", func(h map[string][]string) []byte { delete(h, event.HeaderSpecVersion); return msg.Data }, nil},
		{"bad id", func(h map[string][]string) []byte { h[event.HeaderID] = []string{"x"}; return msg.Data }, nil},
		{"id not a UUIDv7", func(h map[string][]string) []byte { h[event.HeaderID] = []string{uuid.NewString()}; return msg.Data }, nil},
		{"unknown type", func(h map[string][]string) []byte { h[event.HeaderType] = []string{"nope.v1"}; return msg.Data }, nil},
		{"bad time", func(h map[string][]string) []byte { h[event.HeaderTime] = []string{"yesterday"}; return msg.Data }, nil},
		{"empty body", func(map[string][]string) []byte { return nil }, nil},
		{"malformed json", func(map[string][]string) []byte { return []byte("{") }, &event.OrderPlacedV1{}},
		{"total mismatch", func(map[string][]string) []byte {
			return []byte(`{"order_id":"` + uuid.NewString() + `","customer_id":"c","lines":[{"sku":"s","quantity":1,"unit_price_cents":5}],"total_cents":6}`)
		}, &event.OrderPlacedV1{}},
		{"zero quantity", func(map[string][]string) []byte {
			return []byte(`{"order_id":"` + uuid.NewString() + `","customer_id":"c","lines":[{"sku":"s","quantity":0,"unit_price_cents":5}],"total_cents":0}`)
		}, &event.OrderPlacedV1{}},
		{"trailing data", func(map[string][]string) []byte { return append(append([]byte{}, msg.Data...), "{}"...) }, &event.OrderPlacedV1{}},
		{"a repeated member", func(map[string][]string) []byte {
			return append([]byte(`{"total_cents":2,`), msg.Data[1:]...)
		}, &event.OrderPlacedV1{}},
		// Names match exactly: ORDER_ID is an unknown member, and the
		// payload then lacks its order id.
		{"a name in other case", func(map[string][]string) []byte {
			return []byte(`{"ORDER_ID":"` + uuid.NewString() + `","customer_id":"c","lines":[{"sku":"s","quantity":1,"unit_price_cents":5}],"total_cents":5}`)
		}, &event.OrderPlacedV1{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := map[string][]string{}
			for k, v := range msg.Header {
				h[k] = v
			}
			data := tt.mutate(h)
			env, err := event.FromMsg(h, data)
			if tt.decode != nil {
				require.NoError(t, err)
				err = env.Decode(tt.decode)
			}
			require.True(t, errors.Is(err, event.ErrInvalid), "got %v", err)
		})
	}
}

// The inbox's retention deletes an event's record by the time in its id:
// FirstIDAt must sort below every id of its millisecond and above every
// earlier one, in PostgreSQL's order (bytewise) as in Go's.
func TestFirstIDAtBoundsTheIDsMintedBefore(t *testing.T) {
	t.Parallel()
	env := placed(t)
	minted := env.Minted()
	require.WithinDuration(t, env.Time, minted, time.Second)

	bound := event.FirstIDAt(minted)
	require.Equal(t, 7, int(bound.Version()))
	require.Equal(t, uuid.RFC4122, bound.Variant())
	require.True(t, event.Envelope{ID: bound}.Minted().Equal(minted))
	require.LessOrEqual(t, bytes.Compare(bound[:], env.ID[:]), 0, "an id of the bound's millisecond sorts below it")
	next := event.FirstIDAt(minted.Add(time.Millisecond))
	require.Negative(t, bytes.Compare(env.ID[:], next[:]), "an id sorts below the next millisecond's bound")

	// A retention longer than the epoch must not wrap the bound around
	// (which would make every id older than it).
	early := event.FirstIDAt(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))
	require.Negative(t, bytes.Compare(early[:], env.ID[:]))
	late := event.FirstIDAt(time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC))
	require.Positive(t, bytes.Compare(late[:], env.ID[:]))
}

func TestLinesTotalRefusesOverflow(t *testing.T) {
	t.Parallel()
	_, err := event.Lines{{SKU: "a", Quantity: 2, UnitPriceCents: 1 << 62}}.Total()
	require.Error(t, err)
	_, err = event.Lines{{SKU: "a", Quantity: 1, UnitPriceCents: 1 << 62}, {SKU: "b", Quantity: 1, UnitPriceCents: 1 << 62}}.Total()
	require.Error(t, err)
	total, err := event.Lines{{SKU: "a", Quantity: 3, UnitPriceCents: 7}, {SKU: "b", Quantity: 1, UnitPriceCents: 9}}.Total()
	require.NoError(t, err)
	require.Equal(t, int64(30), total)
}

// BenchmarkDecode is why Decode uses encoding/json/v2: every consumer
// decodes every event, and v2 decodes a PaymentDebited payload in less
// than half the time encoding/json takes (about 2 µs against 5 on the
// 2-core VM of the README).
func BenchmarkDecode(b *testing.B) {
	orderID := uuid.New()
	env, err := event.New("payment", event.PaymentDebited, orderID.String(), event.PaymentDebitedV1{
		Order:       event.Order{OrderID: orderID, CustomerID: "c1"},
		Lines:       event.Lines{{SKU: "sku0001", Quantity: 2, UnitPriceCents: 100}, {SKU: "sku0002", Quantity: 1, UnitPriceCents: 100}},
		AmountCents: 300,
	})
	require.NoError(b, err)
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var p event.PaymentDebitedV1
			if err := json.Unmarshal(env.Data, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Envelope.Decode", func(b *testing.B) {
		for b.Loop() {
			var p event.PaymentDebitedV1
			if err := env.Decode(&p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package loyalty_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/loyalty"
)

// start runs the loyalty service for one test, on the test's own database
// and NATS server.
func start(t *testing.T) *apptest.Service {
	t.Helper()
	return apptest.Start(t, loyalty.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
		return loyalty.Run(ctx, loyalty.Config{Config: cfg}, l)
	})
}

// customerEvents reads the starter tally of customer over HTTP.
func customerEvents(t *testing.T, svc *apptest.Service, customer string) int64 {
	t.Helper()
	var got loyalty.CustomerEvents
	resp := svc.Do(t, http.MethodGet, "/customers/"+customer, svc.As(t, customer), nil, &got)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return got.Events
}

// orderConfirmed is a OrderConfirmed of a new order of customer.
func orderConfirmed(t *testing.T, customer string) event.Envelope {
	t.Helper()
	orderID := uuid.Must(uuid.NewV7())
	// From its type's owner, as the inbox's owner check wants.
	ev, err := event.New("order", event.OrderConfirmed, orderID.String(), event.OrderConfirmedV1{Order: event.Order{OrderID: orderID, CustomerID: customer}, TotalCents: 300})
	require.NoError(t, err)
	return ev
}

// TestOrderConfirmedHasOneEffect delivers a OrderConfirmed once and then
// several times (a duplicate under a fresh Nats-Msg-Id passes the broker's
// dedup window; only the inbox stops it): its effect happens once.
func TestOrderConfirmedHasOneEffect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		deliveries int
	}{
		{"once", 1},
		{"five times", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := start(t)
			emitted := svc.Watch(t, streams.Loyalty, "loyalty.points_awarded.v1")
			ev := orderConfirmed(t, "alice")
			svc.Publish(t, ev)
			for range tt.deliveries - 1 {
				svc.PublishDuplicate(t, ev)
			}
			requireProcessed(t, svc, streams.Orders, streams.LoyaltyOrders)
			require.Equal(t, int64(1), customerEvents(t, svc, "alice"))

			// One event out, caused by the one in: the same order.
			got := emitted.Wait(t, 1)
			require.Len(t, got, 1)
			require.Equal(t, event.PointsAwarded, got[0].Type)
			require.Equal(t, ev.Subject, got[0].Subject)
		})
	}
}

// TestConcurrentDuplicatesHaveOneEffect delivers one event ten times at
// once: the deliveries race, and the inbox's primary key lets one through.
func TestConcurrentDuplicatesHaveOneEffect(t *testing.T) {
	t.Parallel()
	svc := start(t)
	ev := orderConfirmed(t, "bob")
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { svc.PublishDuplicate(t, ev) })
	}
	wg.Wait()
	requireProcessed(t, svc, streams.Orders, streams.LoyaltyOrders)
	require.Equal(t, int64(1), customerEvents(t, svc, "bob"))
}

// TestInvalidEventGoesToTheDLQ delivers an event whose payload does not
// validate: it is dead-lettered with its reason, and the events behind it
// are still processed.
func TestInvalidEventGoesToTheDLQ(t *testing.T) {
	t.Parallel()
	svc := start(t)
	dead := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+streams.LoyaltyOrders)
	bad := orderConfirmed(t, "carol")
	bad.Data = []byte(`{}`) // no order, no customer
	svc.Publish(t, bad)
	svc.Publish(t, orderConfirmed(t, "carol"))

	got := dead.Wait(t, 1)
	require.Equal(t, bad.ID, got[0].ID)
	requireProcessed(t, svc, streams.Orders, streams.LoyaltyOrders)
	require.Equal(t, int64(1), customerEvents(t, svc, "carol"))
}

// requireProcessed waits until the durable has acknowledged every message
// of the stream it was given so far.
func requireProcessed(t *testing.T, svc *apptest.Service, stream, durable string) {
	t.Helper()
	s, err := svc.JS.Stream(t.Context(), stream)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	last := info.State.LastSeq
	require.Eventually(t, func() bool {
		cons, err := svc.JS.Consumer(t.Context(), stream, durable)
		require.NoError(t, err)
		ci, err := cons.Info(t.Context())
		require.NoError(t, err)
		return ci.AckFloor.Stream >= last && ci.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond)
}

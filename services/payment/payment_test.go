package payment_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/payment"
)

func start(t *testing.T, configure ...func(*app.Config)) *apptest.Service {
	t.Helper()
	return apptest.Start(t, payment.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
		return payment.Run(ctx, payment.Config{Config: cfg}, l)
	}, configure...)
}

func credit(t *testing.T, svc *apptest.Service, customer string, cents int64) {
	t.Helper()
	resp := svc.Do(t, http.MethodPost, "/wallets/"+customer+"/credits", svc.AsAdmin(t, http.Header{"Idempotency-Key": {uuid.NewString()}}), map[string]int64{"amount_cents": cents}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func balance(t *testing.T, svc *apptest.Service, customer string) int64 {
	t.Helper()
	var w payment.Wallet
	resp := svc.Do(t, http.MethodGet, "/wallets/"+customer, svc.AsAdmin(t), nil, &w)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return w.BalanceCents
}

func orderPlaced(t *testing.T, customer string, total int64) event.Envelope {
	t.Helper()
	orderID := uuid.Must(uuid.NewV7())
	ev, err := event.New("order", event.OrderPlaced, orderID.String(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: orderID, CustomerID: customer},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: total}},
		TotalCents: total,
	})
	require.NoError(t, err)
	return ev
}

func stockRejected(t *testing.T, placed event.Envelope) event.Envelope {
	t.Helper()
	var p event.OrderPlacedV1
	require.NoError(t, placed.Decode(&p))
	ev, err := placed.Caused("inventory", event.StockRejected, event.StockRejectedV1{Order: p.Order, AmountCents: p.TotalCents, Reason: "out of apple"})
	require.NoError(t, err)
	return ev
}

func TestOrderPlacedDebitsOnceOrRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		credit      int64 // 0: never credited
		total       int64
		deliveries  int
		wantType    event.Type
		wantBalance int64
	}{
		{"covered", 1000, 300, 1, event.PaymentDebited, 700},
		{"exactly covered", 300, 300, 1, event.PaymentDebited, 0},
		{"covered, delivered 5 times", 1000, 300, 5, event.PaymentDebited, 700},
		{"insufficient funds", 100, 300, 1, event.PaymentRejected, 100},
		{"insufficient, delivered 5 times", 100, 300, 5, event.PaymentRejected, 100},
		{"never credited", 0, 1, 3, event.PaymentRejected, 0},
	}
	for _, tt := range tests {
		apptest.EachMode(t, tt.name, func(t *testing.T, mode func(*app.Config)) {
			svc := start(t, mode)
			if tt.credit > 0 {
				credit(t, svc, "alice", tt.credit)
			}
			outcomes := svc.Watch(t, streams.Payments, "payments.>")
			ev := orderPlaced(t, "alice", tt.total)
			svc.Publish(t, ev)
			for range tt.deliveries - 1 {
				svc.PublishDuplicate(t, ev)
			}

			got := outcomes.Wait(t, 1)
			require.Equal(t, tt.wantType, got[0].Type)
			require.Equal(t, ev.Subject, got[0].Subject)
			requireProcessed(t, svc, streams.PaymentOrders, int64(tt.deliveries))
			require.Len(t, outcomes.Seen(), 1, "one outcome per order, whatever the deliveries")
			require.Equal(t, tt.wantBalance, balance(t, svc, "alice"))
		})
	}
}

func TestConcurrentDuplicatesDebitOnce(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "bob", 1000)
		ev := orderPlaced(t, "bob", 400)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() { svc.PublishDuplicate(t, ev) })
		}
		wg.Wait()
		requireProcessed(t, svc, streams.PaymentOrders, 10)
		require.Equal(t, int64(600), balance(t, svc, "bob"))
	})
}

func TestStockRejectedRefundsOnce(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "carol", 1000)
		refunds := svc.Watch(t, streams.Payments, "payments.refunded.v1")
		placed := orderPlaced(t, "carol", 250)
		svc.Publish(t, placed)
		requireProcessed(t, svc, streams.PaymentOrders, 1)
		require.Equal(t, int64(750), balance(t, svc, "carol"))

		rejected := stockRejected(t, placed)
		for range 3 {
			svc.PublishDuplicate(t, rejected)
		}
		got := refunds.Wait(t, 1)
		var p event.PaymentRefundedV1
		require.NoError(t, got[0].Decode(&p))
		require.Equal(t, int64(250), p.AmountCents)
		requireProcessed(t, svc, streams.PaymentInventory, 3)
		require.Len(t, refunds.Seen(), 1)
		require.Equal(t, int64(1000), balance(t, svc, "carol"), "refunded once, never more than the debit")
	})
}

func TestStockRejectedForRejectedPaymentRefundsNothing(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "dave", 10)
		placed := orderPlaced(t, "dave", 500)
		svc.Publish(t, placed)
		requireProcessed(t, svc, streams.PaymentOrders, 1)
		svc.Publish(t, stockRejected(t, placed))
		requireProcessed(t, svc, streams.PaymentInventory, 1)
		require.Equal(t, int64(10), balance(t, svc, "dave"))
	})
}

// requireProcessed waits until the durable has acknowledged n deliveries.
func requireProcessed(t *testing.T, svc *apptest.Service, durable string, n int64) {
	t.Helper()
	stream := streams.Orders
	if durable == streams.PaymentInventory {
		stream = streams.Inventory
	}
	require.Eventually(t, func() bool {
		cons, err := svc.JS.Consumer(t.Context(), stream, durable)
		require.NoError(t, err)
		info, err := cons.Info(t.Context())
		require.NoError(t, err)
		return info.AckFloor.Stream >= uint64(n) && info.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond)
}

// paymentOf returns the status of the payment of the order of placed and
// how many payments that order has.
func paymentOf(t *testing.T, svc *apptest.Service, placed event.Envelope) (status string, payments int) {
	t.Helper()
	var p event.OrderPlacedV1
	require.NoError(t, placed.Decode(&p))
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
		`SELECT coalesce(min(status), ''), count(*) FROM payments WHERE order_id = $1`, p.OrderID).Scan(&status, &payments))
	return status, payments
}

// deliverTwo publishes two events for one order, at once (a batched
// consumer may take them in one batch) or the second once durable has
// processed the first, and requires both to be processed, neither retried
// nor dead-lettered: a second event for an order is no error.
func deliverTwo(t *testing.T, svc *apptest.Service, durable string, together bool, first, second event.Envelope) {
	t.Helper()
	require.NotEqual(t, first.ID, second.ID)
	if together {
		svc.PublishAtOnce(t, first, second)
	} else {
		svc.Publish(t, first)
		requireProcessed(t, svc, durable, 1)
		svc.Publish(t, second)
	}
	requireProcessed(t, svc, durable, 2)
	require.Equal(t, 2, svc.InboxCount(t, durable, "processed"), "processed")
	require.Zero(t, svc.InboxCount(t, durable, "retried"), "retried")
	require.Zero(t, svc.InboxCount(t, durable, "dead_lettered"), "dead-lettered")
}

// TestSecondOrderPlacedForAnOrderPaysOnce delivers two OrderPlaced events
// for one order under different event ids, which the inbox cannot tell
// apart: the order is paid once, by its payment row, whether the second
// comes later or in the first's batch.
func TestSecondOrderPlacedForAnOrderPaysOnce(t *testing.T) {
	t.Parallel()
	for _, together := range []bool{false, true} {
		apptest.EachConsumerMode(t, fmt.Sprint("together=", together), func(t *testing.T, mode func(*app.Config)) {
			svc := start(t, mode)
			credit(t, svc, "frank", 1000)
			outcomes := svc.Watch(t, streams.Payments, "payments.>")
			first := orderPlaced(t, "frank", 300)
			second := first
			second.ID = uuid.Must(uuid.NewV7())
			deliverTwo(t, svc, streams.PaymentOrders, together, first, second)
			require.Equal(t, int64(700), balance(t, svc, "frank"), "debited once")
			status, payments := paymentOf(t, svc, first)
			require.Equal(t, payment.StatusDebited, status)
			require.Equal(t, 1, payments)
			require.Equal(t, event.PaymentDebited, outcomes.Wait(t, 1)[0].Type)
			require.Equal(t, 1, emitted(t, svc), "one outcome for the order")
		})
	}
}

// TestSecondStockRejectedForAnOrderRefundsOnce delivers two StockRejected
// events for one order under different event ids, which the inbox cannot
// tell apart: one refund, the balance back exactly once, the payment
// REFUNDED, whether the second comes later or in the first's batch.
func TestSecondStockRejectedForAnOrderRefundsOnce(t *testing.T) {
	t.Parallel()
	for _, together := range []bool{false, true} {
		apptest.EachConsumerMode(t, fmt.Sprint("together=", together), func(t *testing.T, mode func(*app.Config)) {
			svc := start(t, mode)
			credit(t, svc, "grace", 1000)
			refunds := svc.Watch(t, streams.Payments, "payments.refunded.v1")
			placed := orderPlaced(t, "grace", 250)
			svc.Publish(t, placed)
			requireProcessed(t, svc, streams.PaymentOrders, 1)
			require.Equal(t, int64(750), balance(t, svc, "grace"))

			deliverTwo(t, svc, streams.PaymentInventory, together, stockRejected(t, placed), stockRejected(t, placed))
			require.Equal(t, int64(1000), balance(t, svc, "grace"), "refunded exactly once")
			status, _ := paymentOf(t, svc, placed)
			require.Equal(t, payment.StatusRefunded, status)
			refunds.Wait(t, 1)
			require.Equal(t, 2, emitted(t, svc), "the debit and one refund")
		})
	}
}

// emitted counts the service's outbox rows: every event it has emitted,
// published or not.
func emitted(t *testing.T, svc *apptest.Service) int {
	t.Helper()
	var n int
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

// failCommitsOnWallets makes every commit that changed a wallet fail, by a
// trigger deferred to the commit, until the returned function lifts the
// fault: a transaction whose every statement succeeded and whose commit
// does not.
func failCommitsOnWallets(t *testing.T, svc *apptest.Service) (lift func()) {
	t.Helper()
	_, err := svc.DB.Pool.Exec(t.Context(), `
		CREATE TABLE test_fault (on_ boolean NOT NULL);
		INSERT INTO test_fault VALUES (true);
		CREATE FUNCTION test_fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT on_ FROM test_fault) THEN
				RAISE EXCEPTION 'test fault: commit refused';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER test_fail_commit AFTER UPDATE ON wallets
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_fail_commit();`)
	require.NoError(t, err)
	return func() {
		_, err := svc.DB.Pool.Exec(t.Context(), `UPDATE test_fault SET on_ = false`)
		require.NoError(t, err)
	}
}

// TestRefundWhoseCommitFailsEmitsNothing fails the commit of a refund, after
// every statement of its handler, event included, succeeded: the event is
// not emitted, and once the fault is lifted the redelivery refunds and
// emits once. The refund's event is written in the refund's transaction.
func TestRefundWhoseCommitFailsEmitsNothing(t *testing.T) {
	t.Parallel()
	apptest.EachConsumerMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := apptest.StartWithStreams(t, payment.Name, func(ctx context.Context, cfg app.Config, l *slog.Logger) error {
			return payment.Run(ctx, payment.Config{Config: cfg}, l)
		}, streams.Config{MaxDeliver: 100}, mode)
		credit(t, svc, "heidi", 1000)
		placed := orderPlaced(t, "heidi", 400)
		svc.Publish(t, placed)
		requireProcessed(t, svc, streams.PaymentOrders, 1)

		lift := failCommitsOnWallets(t, svc)
		svc.Publish(t, stockRejected(t, placed))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.GreaterOrEqual(c, svc.InboxCount(c, streams.PaymentInventory, "retried"), 2)
		}, 20*time.Second, 20*time.Millisecond, "the refund's commit fails")
		require.Equal(t, 1, emitted(t, svc), "the debit, and no refund")
		require.Equal(t, int64(600), balance(t, svc, "heidi"))

		lift()
		requireProcessed(t, svc, streams.PaymentInventory, 1)
		require.Equal(t, int64(1000), balance(t, svc, "heidi"))
		require.Equal(t, 2, emitted(t, svc), "the debit and one refund")
	})
}

// TestHandlersWriteOnlyInTheirTransaction runs each handler, on each of
// its paths that writes, in a transaction that is then rolled back: its
// payment, wallet and outbox writes roll back with it.
func TestHandlersWriteOnlyInTheirTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, payment.Name)
	s := payment.New(db.Pool)
	_, err := db.Pool.Exec(t.Context(), `INSERT INTO wallets (customer_id, balance_cents) VALUES ('judy', 1000)`)
	require.NoError(t, err)
	paid := orderPlaced(t, "judy", 400)
	apptest.InTx(t, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return s.HandleOrderPlaced(ctx, tx, paid) })

	apptest.RequireRollsBack(t, db.Pool,
		apptest.Handled{Name: "OrderPlaced debited", Handle: s.HandleOrderPlaced, Event: orderPlaced(t, "judy", 300)},
		apptest.Handled{Name: "OrderPlaced rejected", Handle: s.HandleOrderPlaced, Event: orderPlaced(t, "judy", 5000)},
		apptest.Handled{Name: "StockRejected refunded", Handle: s.HandleStockRejected, Event: stockRejected(t, paid)},
	)
}

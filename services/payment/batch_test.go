package payment_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/payment"
)

// TestOrderPlacedBatchEqualsEventByEvent runs one random sequence of
// OrderPlaced events through HandleOrderPlaced, one transaction per event,
// and through HandleOrderPlacedBatch in random batches, on two databases
// seeded alike, and requires the same wallets, payments and emitted events.
func TestOrderPlacedBatchEqualsEventByEvent(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			ref, set := testenv.NewServiceDatabase(t, payment.Name), testenv.NewServiceDatabase(t, payment.Name)

			// c5 has no wallet; the others have a balance that some of
			// their orders exhaust.
			for i := range 5 {
				customer, cents := fmt.Sprint("c", i), rng.Int64N(80)*250
				for _, db := range []*testenv.Database{ref, set} {
					_, err := db.Pool.Exec(t.Context(), `INSERT INTO wallets (customer_id, balance_cents) VALUES ($1, $2)`, customer, cents)
					require.NoError(t, err)
				}
			}
			evs := randomOrders(t, rng, 300)

			batches := apptest.RandomBatches(rng, evs)
			fellBack := apptest.ApplyBothForms(t, ref.Pool, set.Pool, batches,
				payment.New(ref.Pool).HandleOrderPlaced, payment.New(set.Pool).HandleOrderPlacedBatch)
			// A batch falls back to the per-event handler exactly when it
			// re-emits an order of an earlier batch.
			require.Equal(t, apptest.Repeating(batches), fellBack)
			require.Positive(t, fellBack, "some batches re-emit an earlier order")
			require.Less(t, fellBack, len(batches)/2, "most batches are set-based")
			apptest.RequireSameRows(t, ref.Pool, set.Pool,
				`SELECT customer_id, balance_cents FROM wallets ORDER BY customer_id`,
				`SELECT order_id, customer_id, amount_cents, status, reason FROM payments ORDER BY order_id`,
				// Emitted events get fresh ids and times; everything else,
				// their order included, must match.
				`SELECT event_type, source, subject, nats_subject, data, traceparent FROM outbox ORDER BY id`,
			)
			var debited, rejected int
			require.NoError(t, ref.Pool.QueryRow(t.Context(),
				`SELECT count(*) FILTER (WHERE status = 'DEBITED'), count(*) FILTER (WHERE status = 'REJECTED') FROM payments`).
				Scan(&debited, &rejected))
			require.Positive(t, debited, "the sequence debits")
			require.Positive(t, rejected, "the sequence exhausts wallets")
		})
	}
}

// randomOrders returns n OrderPlaced events of customers c0 to c5; about one
// in forty re-emits an earlier order under a new event id.
func randomOrders(t *testing.T, rng *rand.Rand, n int) []event.Envelope {
	t.Helper()
	var evs []event.Envelope
	for len(evs) < n {
		if len(evs) > 0 && rng.IntN(40) == 0 {
			again := evs[rng.IntN(len(evs))]
			again.ID = uuid.Must(uuid.NewV7())
			evs = append(evs, again)
			continue
		}
		var lines event.Lines
		for range 1 + rng.IntN(3) {
			lines = append(lines, event.OrderLine{
				SKU:            []string{"apple", "pear"}[rng.IntN(2)],
				Quantity:       1 + rng.Int32N(5),
				UnitPriceCents: rng.Int64N(4) * 250, // sometimes free
			})
		}
		total, err := lines.Total()
		require.NoError(t, err)
		ev := orderPlaced(t, fmt.Sprint("c", rng.IntN(6)), 1)
		var p event.OrderPlacedV1
		require.NoError(t, ev.Decode(&p))
		p.Lines, p.TotalCents = lines, total
		ev, err = event.New("order", event.OrderPlaced, ev.Subject, p)
		require.NoError(t, err)
		if rng.IntN(2) == 0 {
			ev.TraceParent = fmt.Sprintf("00-%032x-%016x-01", rng.Uint64(), rng.Uint64()|1)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestOrdersOfOneWalletAreDebitedInStreamOrder sends a wallet more orders
// than it covers, with a poison event among them, at once, so that they
// share batches: the orders that fit are debited in stream order, the rest
// rejected, and the poison dead-lettered without failing its batch.
func TestOrdersOfOneWalletAreDebitedInStreamOrder(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc := start(t, mode)
		credit(t, svc, "erin", 1000)
		outcomes := svc.Watch(t, streams.Payments, "payments.>")
		dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+streams.PaymentOrders)

		var orders []event.Envelope
		for range 8 {
			orders = append(orders, orderPlaced(t, "erin", 300))
		}
		poison := orderPlaced(t, "erin", 300)
		poison.Data = []byte(strings.Replace(string(poison.Data), `"total_cents":300`, `"total_cents":1`, 1))
		for i, ev := range append(slices.Insert(slices.Clone(orders), 4, poison), orders[0]) {
			msg, err := ev.Msg()
			require.NoError(t, err)
			if i == 9 {
				msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString()) // a duplicate for the inbox
			}
			_, err = svc.JS.PublishMsgAsync(msg)
			require.NoError(t, err)
		}
		select {
		case <-svc.JS.PublishAsyncComplete():
		case <-t.Context().Done():
		}

		require.Equal(t, poison.ID, dlq.Wait(t, 1)[0].ID)
		got := map[string]event.Type{}
		for _, ev := range outcomes.Wait(t, len(orders)) {
			got[ev.Subject] = ev.Type
		}
		for i, ev := range orders {
			want := event.PaymentRejected
			if i < 3 {
				want = event.PaymentDebited
			}
			require.Equal(t, want, got[ev.Subject], "order %d", i)
		}
		requireProcessed(t, svc, streams.PaymentOrders, 10)
		require.Len(t, outcomes.Seen(), len(orders))
		require.Equal(t, int64(100), balance(t, svc, "erin"))
	})
}

// Two refund batches over the same two wallets, their orders in opposite
// wallet orders, run at once. Each locks the wallets of its batch in key
// order before its first refund, so neither can hold one wallet while it
// waits for the other's: no deadlock (40P01). The test holds each batch
// at its second refund, on that payment's row, until both have begun.
func TestRefundBatchesInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.NewServiceDatabase(t, payment.Name)
	svc := payment.New(db.Pool)
	_, err := db.Pool.Exec(ctx, `INSERT INTO wallets (customer_id, balance_cents) VALUES ('ann', 1000), ('bob', 1000)`)
	require.NoError(t, err)
	placed := map[string]event.Envelope{}
	paid := testenv.Begin(t, db.Pool)
	for _, order := range []string{"ann1", "ann2", "bob1", "bob2"} {
		placed[order] = orderPlaced(t, order[:3], 100)
		require.NoError(t, svc.HandleOrderPlaced(ctx, paid, placed[order]))
	}
	require.NoError(t, paid.Commit(ctx))

	hold := testenv.Begin(t, db.Pool)
	_, err = hold.Exec(ctx, `SELECT FROM payments WHERE order_id = ANY($1) FOR UPDATE`,
		[]uuid.UUID{uuid.MustParse(placed["bob1"].Subject), uuid.MustParse(placed["ann2"].Subject)})
	require.NoError(t, err)
	batches := [][]event.Envelope{
		{stockRejected(t, placed["ann1"]), stockRejected(t, placed["bob1"])},
		{stockRejected(t, placed["bob2"]), stockRejected(t, placed["ann2"])},
	}
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for i, evs := range batches {
		tx := testenv.Begin(t, db.Pool)
		wg.Go(func() {
			if errs[i] = svc.HandleStockRejectedBatch(ctx, tx, evs, nil); errs[i] == nil {
				errs[i] = tx.Commit(ctx)
			}
		})
	}
	t.Cleanup(wg.Wait) // before the transactions' rollbacks
	require.Eventually(t, func() bool {
		var waiting int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == len(batches)
	}, 30*time.Second, 10*time.Millisecond, "both batches wait for a lock")
	require.NoError(t, hold.Rollback(ctx))
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	var ann, bob int64
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT sum(balance_cents) FILTER (WHERE customer_id = 'ann'), sum(balance_cents) FILTER (WHERE customer_id = 'bob') FROM wallets`).
		Scan(&ann, &bob))
	require.Equal(t, []int64{1000, 1000}, []int64{ann, bob}, "every order refunded")
}

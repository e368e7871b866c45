package notify_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/notify"
)

// notificationsQuery is every stored column but the timestamps, which
// differ between two runs: ids included, so that the sending order and the
// sequence's use must match too.
const notificationsQuery = `
	SELECT id, order_id, kind, recipient, event_id, message_id, subject, body, status, last_error, attempts
	FROM notifications ORDER BY id`

// TestOrderMilestoneBatchEqualsEventByEvent runs one random sequence of
// order milestones through HandleOrderMilestone, one transaction per event,
// and through HandleOrderMilestoneBatch in random batches, on two databases,
// and requires the same notifications.
func TestOrderMilestoneBatchEqualsEventByEvent(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			ref, set := testenv.NewServiceDatabase(t, notify.Name), testenv.NewServiceDatabase(t, notify.Name)
			evs := randomMilestones(t, rng, 300)

			fellBack := apptest.ApplyBothForms(t, ref.Pool, set.Pool, apptest.RandomBatches(rng, evs),
				notify.New(ref.Pool).HandleOrderMilestone, notify.New(set.Pool).HandleOrderMilestoneBatch)
			require.Zero(t, fellBack, "batches that fell back")

			want := apptest.Rows(t, ref.Pool, notificationsQuery)
			require.Equal(t, want, apptest.Rows(t, set.Pool, notificationsQuery))

			kinds := map[string]bool{}
			var failed int
			for _, r := range want {
				kinds[r[2].(string)] = true
				if r[8] == notify.StatusFailed {
					failed++
				}
			}
			require.Len(t, kinds, 4, "every milestone kind is written")
			require.Positive(t, failed, "the sequence has invalid recipients")
			require.Less(t, len(want), len(evs), "the sequence re-emits milestones")
		})
	}
}

// TestOrderMilestoneBatchFirstWins puts the same milestone under two event
// ids, and the same event twice, in one batch: the first one's row stays,
// as with one event after the other.
func TestOrderMilestoneBatchFirstWins(t *testing.T) {
	t.Parallel()
	ref, set := testenv.NewServiceDatabase(t, notify.Name), testenv.NewServiceDatabase(t, notify.Name)

	placed := orderPlaced(t, "ivy", "ivy@shop.example")
	confirmed := milestone(t, placed, event.OrderConfirmed)
	again := milestone(t, placed, event.OrderConfirmed) // same milestone, new event id
	other := orderPlaced(t, "jay", "not an address")
	batch := []event.Envelope{confirmed, placed, again, other, placed, reemit(other)}

	refSvc, setSvc := notify.New(ref.Pool), notify.New(set.Pool)
	for _, ev := range batch {
		apptest.InTx(t, ref.Pool, func(ctx context.Context, tx pgx.Tx) error { return refSvc.HandleOrderMilestone(ctx, tx, ev) })
	}
	apptest.InTx(t, set.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return apptest.ApplyBatch(ctx, tx, setSvc.HandleOrderMilestoneBatch, batch)
	})

	want := apptest.Rows(t, ref.Pool, notificationsQuery)
	require.Equal(t, want, apptest.Rows(t, set.Pool, notificationsQuery))
	got := rows(t, set.Pool, orderID(t, placed))
	require.Len(t, got, 2)
	require.Equal(t, []uuid.UUID{confirmed.ID, placed.ID}, []uuid.UUID{got[0].EventID, got[1].EventID}, "fetch order, first one wins")
	bad := rows(t, set.Pool, orderID(t, other))
	require.Len(t, bad, 1)
	require.Equal(t, notify.StatusFailed, bad[0].Status)
	require.Contains(t, bad[0].LastError, "invalid recipient")
}

// TestOrderMilestoneBatchRefusesBadEvents checks that an event the handler
// would refuse fails the whole batch, leaving the per-event fallback to
// dead-letter it alone.
func TestOrderMilestoneBatchRefusesBadEvents(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, notify.Name)
	s := notify.New(db.Pool)
	good := orderPlaced(t, "kai", "")
	debited, err := good.Caused("payment", event.PaymentDebited, event.PaymentDebitedV1{})
	require.NoError(t, err)
	for name, bad := range map[string]event.Envelope{"other type": debited, "invalid": invalidPlaced(t)} {
		t.Run(name, func(t *testing.T) {
			tx, err := db.Pool.Begin(t.Context())
			require.NoError(t, err)
			defer func() { require.NoError(t, tx.Rollback(t.Context())) }()
			err = apptest.ApplyBatch(t.Context(), tx, s.HandleOrderMilestoneBatch, []event.Envelope{good, bad})
			require.Error(t, err)
			require.True(t, errors.Is(err, inbox.ErrPermanent) || errors.Is(err, event.ErrInvalid), "got %v", err)
		})
	}
	require.Zero(t, countNotifications(t, db.Pool))
}

// TestMilestonesInOneBatchPerMode sends milestones, re-emitted ones, an
// invalid recipient and a poison event at once, so that they share
// batches, set-based and per event: both write the same rows and
// dead-letter the poison alone.
func TestMilestonesInOneBatchPerMode(t *testing.T) {
	t.Parallel()
	apptest.EachMode(t, "", func(t *testing.T, mode func(*app.Config)) {
		svc, _ := start(t, func(c *notify.Config) { mode(&c.Config) })
		dlq := svc.Watch(t, streams.DLQ, streams.DLQSubjectPrefix+streams.NotifyOrders)

		var evs, orders, firsts []event.Envelope
		for i, typ := range []event.Type{event.OrderConfirmed, event.OrderRejected, event.OrderCancelled, event.OrderConfirmed} {
			email := fmt.Sprintf("c%d@shop.example", i)
			if i == 3 {
				email = "not an address"
			}
			placed := orderPlaced(t, fmt.Sprint("c", i), email)
			m := milestone(t, placed, typ)
			orders, firsts = append(orders, placed), append(firsts, m)
			evs = append(evs, placed, m, reemit(m))
		}
		poison := invalidPlaced(t)
		evs = slices.Insert(evs, 5, poison)
		svc.PublishAtOnce(t, evs...)

		require.Equal(t, poison.ID, dlq.Wait(t, 1)[0].ID)
		requireProcessed(t, svc, uint64(len(evs)))
		for i, placed := range orders {
			got := rows(t, svc.DB.Pool, orderID(t, placed))
			require.Len(t, got, 2, "order %d", i)
			require.Equal(t, placed.ID, got[0].EventID)
			require.Equal(t, firsts[i].ID, got[1].EventID, "the first of a re-emitted milestone wins")
			if i == 3 {
				require.Equal(t, notify.StatusFailed, got[0].Status)
			}
		}
		require.Equal(t, 2*len(orders), countNotifications(t, svc.DB.Pool))
	})
}

// randomMilestones returns n order milestones of a few dozen orders, of
// every type, about one in ten re-emitted under a new event id (often right
// after the original, so in the same batch) and one customer in eight
// with an address no mail server takes.
func randomMilestones(t *testing.T, rng *rand.Rand, n int) []event.Envelope {
	t.Helper()
	var placed, evs []event.Envelope
	for len(evs) < n {
		switch r := rng.IntN(10); {
		case len(evs) > 0 && r == 0:
			again := reemit(evs[len(evs)-1-rng.IntN(min(len(evs), 3))])
			evs = append(evs, again)
		case len(placed) == 0 || r < 4:
			customer := fmt.Sprint("c", rng.IntN(1000))
			email := customer + "@shop.example"
			switch rng.IntN(8) {
			case 0:
				email = "not an address"
			case 1:
				email = "" // the placeholder
			}
			p := orderPlaced(t, customer, email)
			placed = append(placed, p)
			evs = append(evs, p)
		default:
			typ := []event.Type{event.OrderConfirmed, event.OrderRejected, event.OrderCancelled}[rng.IntN(3)]
			evs = append(evs, milestone(t, placed[rng.IntN(len(placed))], typ))
		}
	}
	return evs
}

// reemit is ev under a new event id: the same milestone again.
func reemit(ev event.Envelope) event.Envelope {
	ev.ID = uuid.Must(uuid.NewV7())
	return ev
}

// invalidPlaced is an OrderPlaced event whose total does not match its
// lines: no retry can make it valid.
func invalidPlaced(t *testing.T) event.Envelope {
	t.Helper()
	ev := orderPlaced(t, "poison", "")
	ev.Data = []byte(strings.Replace(string(ev.Data), `"total_cents":375`, `"total_cents":1`, 1))
	require.NotContains(t, string(ev.Data), `"total_cents":375`)
	return ev
}

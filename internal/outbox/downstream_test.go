package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// A relay that publishes and dies before marking its rows sent makes the
// next relay publish them again. Past the broker's duplicate window both
// copies are in the stream; the consumer's inbox is what keeps the effect
// single.
func TestRelayDeathCausesNoDuplicateEffectDownstream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 100*time.Millisecond)
	_, err := f.db.Pool.Exec(ctx, `CREATE TABLE effects (event_id uuid NOT NULL)`)
	require.NoError(t, err)

	evs := []event.Envelope{
		newEvent(t, event.OrderPlaced, "order-1", 1),
		newEvent(t, event.OrderPlaced, "order-2", 1),
	}
	enqueue(t, f.db.Pool, evs...)
	dying := f.relay(outbox.RelayConfig{})
	outbox.SetAfterPublish(dying, func() error { return errors.New("relay died") })
	_, err = dying.Flush(ctx)
	require.Error(t, err)
	awaitDuplicateWindowPassed(t, f.js, "orders.probe")
	n, err := f.relay(outbox.RelayConfig{}).Flush(ctx)
	require.NoError(t, err)
	require.Equal(t, len(evs), n)

	consumer := inbox.New(f.db.Pool, f.js, inbox.Config{Stream: streams.Orders, Durable: streams.PaymentOrders},
		func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.ID)
			return err
		}, f.logger)
	run(t, consumer)

	require.Eventually(t, func() bool {
		s := consumer.Stats()
		return s.Processed+s.Duplicates == int64(2*len(evs))
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(len(evs)), consumer.Stats().Duplicates, "each event was in the stream twice")
	for _, ev := range evs {
		var effects int
		require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID).Scan(&effects))
		require.Equal(t, 1, effects, "event %s", ev.ID)
	}
}

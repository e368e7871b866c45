package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// Producers whose transactions commit out of id order, some held open
// while the relay publishes many batches past their rows, against a
// running relay with small batches: every event is published exactly once
// and each aggregate's events in the order they were written. The late
// rows are what the relay's position must not skip; the mix of short and
// long transactions is random, the long ones held on purpose.
func TestConcurrentProducersWithLateCommitsLoseNothing(t *testing.T) {
	t.Parallel()
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined %v", pipelined), func(t *testing.T) {
			t.Parallel()
			concurrentProducersWithLateCommits(t, outbox.RelayConfig{BatchSize: 3, PollInterval: 20 * time.Millisecond, Pipelined: pipelined})
		})
	}
}

func concurrentProducersWithLateCommits(t *testing.T, cfg outbox.RelayConfig) {
	ctx := t.Context()
	f := setup(t)
	f.provision(t, 0)
	published := countPublishes(t, f.nats, "orders.>")
	run(t, f.relay(cfg))

	const producers, perProducer = 6, 30
	var (
		mu      sync.Mutex
		written = map[string][]string{} // aggregate → event ids, in commit order
		total   int
	)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			aggregate := fmt.Sprintf("order-%d", p)
			for seq := 0; seq < perProducer; {
				tx := testenv.Begin(t, f.db.Pool)
				var ids []string
				for range 1 + rng.IntN(3) {
					ev := newEvent(t, event.OrderPlaced, aggregate, seq)
					seq++
					assert.NoError(t, outbox.Enqueue(ctx, tx, ev))
					ids = append(ids, ev.ID.String())
				}
				// Most transactions commit at once; one in five stays
				// open while the other producers' rows, with higher ids,
				// go out.
				if rng.IntN(5) == 0 {
					time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond)
				}
				assert.NoError(t, tx.Commit(ctx))
				mu.Lock()
				written[aggregate] = append(written[aggregate], ids...)
				total += len(ids)
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, total, len(published()))
	}, 30*time.Second, 20*time.Millisecond, "every event published")
	for id, n := range published() {
		require.Equal(t, 1, n, "publishes of %s", id)
	}
	got := map[string][]string{}
	for _, m := range streamMsgs(t, f.js, streams.Orders) {
		agg := m.Header.Get(event.HeaderSubject)
		got[agg] = append(got[agg], m.Header.Get(event.HeaderID))
	}
	require.Equal(t, written, got, "each aggregate's events once, in the order they were written")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		lag, err := outbox.NewRelay(f.db.Pool, f.js, outbox.RelayConfig{}, f.logger).Lag(context.WithoutCancel(ctx))
		assert.NoError(c, err)
		assert.Zero(c, lag.Unsent)
	}, 10*time.Second, 20*time.Millisecond, "every row marked sent")
	requireOracle(t, f.db, published())
}

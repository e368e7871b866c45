package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestConsumerWorkloadsDebitEveryEventOnce checks, on a few hundred events,
// that each benchmarked consumer does the work its figure claims: every
// event debited once, by the inbox in every mode and by the naive consumer.
func TestConsumerWorkloadsDebitEveryEventOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	for _, m := range consumerModes {
		for _, kind := range []string{"inbox", "naive"} {
			t.Run(kind+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				pool := testenv.NewDatabase(t, schemaOf(t, "payment")).Pool
				seedWallets(t, pool)
				js := newJetStream(t)
				provisionOrders(t, js, streams.Orders, "orders.>")
				ds := orderEvents(t, n)
				var want int64
				for _, d := range ds {
					want += d.amount
				}
				require.NoError(t, publishAll(t.Context(), js, messages(t, envelopes(ds))))

				var c runner
				var count func() int64
				if kind == "inbox" {
					cfg := inbox.Config{Stream: streams.Orders, Durable: benchConsumer, BatchSize: batchSize, Batched: m.batched, Workers: m.workers}
					if m.setBased {
						cfg.BatchHandler = handleDebits
					}
					ic := inbox.New(pool, js, cfg, handleDebit, quiet)
					c, count = ic, func() int64 { return ic.Stats().Processed }
				} else {
					nc := &naive{pool: pool, js: js, mode: m}
					c, count = nc, nc.processed.Load
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- c.Run(ctx) }()
				require.Eventually(t, func() bool { return count() == n }, time.Minute, 10*time.Millisecond)
				cancel()
				require.NoError(t, <-done)

				var debited int64
				require.NoError(t, pool.QueryRow(t.Context(),
					`SELECT $1::bigint * 1000000000000 - sum(balance_cents) FROM wallets`, wallets).Scan(&debited))
				require.Equal(t, want, debited)
			})
		}
	}
}

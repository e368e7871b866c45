package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/jsbatch"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// consumerMode is how a consumer runs its handlers.
type consumerMode struct {
	name     string
	batched  bool
	setBased bool
	workers  int
}

var consumerModes = []consumerMode{
	{name: "unbatched/workers=1", workers: 1},
	{name: "unbatched/workers=4", workers: 4},
	{name: "batched/workers=1", batched: true, workers: 1},
	{name: "setbased/workers=1", batched: true, setBased: true, workers: 1},
}

// planEachCallSQL is the inbox's PlanEachCall query, with which it plans a
// set-based batch's statements for their arguments.
const planEachCallSQL = "-- name: PlanEachCall :exec\nSELECT set_config('plan_cache_mode', 'force_custom_plan', true)"

// handleDebit is the benchmarks' per-event handler: decode the order, debit
// its wallet. The debit is an :exec: the inbox sends it with the COMMIT.
func handleDebit(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p event.OrderPlacedV1
	if err := ev.Decode(&p); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, debitExecSQL, p.CustomerID, p.TotalCents)
	return err
}

// handleDebits is its set-based form.
func handleDebits(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *postgres.Pipeline) error {
	customers, amounts := make([]string, len(evs)), make([]int64, len(evs))
	for i, ev := range evs {
		var p event.OrderPlacedV1
		if err := ev.Decode(&p); err != nil {
			return err
		}
		customers[i], amounts[i] = p.CustomerID, p.TotalCents
	}
	return debitSet(ctx, tx, customers, amounts)
}

// provisionOrders creates the ORDERS stream and the durable "bench" on it.
func provisionOrders(b testing.TB, js jetstream.JetStream, stream, subject string) {
	b.Helper()
	err := streams.Provision(context.Background(), js, streams.Topology{
		Streams:   []streams.Stream{{Name: stream, Subjects: []string{subject}}},
		Consumers: []streams.Consumer{{Stream: stream, Durable: benchConsumer, MaxAckPending: 10_000}},
	})
	require.NoError(b, err)
}

// runner is a consumer under measurement.
type runner interface {
	Run(ctx context.Context) error
}

// measureConsumer publishes evs to stream, then times c from its start until
// count reaches len(evs), and reports events/s and CPU time per event.
func measureConsumer(b *testing.B, js jetstream.JetStream, evs []event.Envelope, c runner, count func() int64) {
	b.Helper()
	require.NoError(b, publishAll(context.Background(), js, messages(b, evs)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := measure(b)
	go func() { done <- c.Run(ctx) }()
	awaitCount(b, int64(len(evs)), count)
	m.stop()
	cancel()
	require.NoError(b, <-done)
	m.report(len(evs))
}

// BenchmarkInbox is the inbox consumer: JetStream → claim → wallet debit →
// commit → ack, unbatched on 1 and 4 workers (connections), batched with the
// per-event handler, and batched with the set-based handler.
func BenchmarkInbox(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range consumerModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.walletsDB(b)
				js := newJetStream(b)
				provisionOrders(b, js, streams.Orders, "orders.>")
				cfg := inbox.Config{Stream: streams.Orders, Durable: benchConsumer, BatchSize: batchSize, Batched: m.batched, Workers: m.workers}
				if m.setBased {
					cfg.BatchHandler = handleDebits
				}
				c := inbox.New(pool, js, cfg, handleDebit, quiet)
				measureConsumer(b, js, envelopes(orderEvents(b, b.N)), c, func() int64 { return c.Stats().Processed })
			})
		}
	}
}

// BenchmarkNaive is the same consumer without the inbox: the same batches
// (package jsbatch), decode, handler, transaction and ack, but no claim, so
// no dedup. Its time per event against BenchmarkInbox's is the overhead of
// correctness.
func BenchmarkNaive(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range consumerModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.walletsDB(b)
				js := newJetStream(b)
				provisionOrders(b, js, streams.Orders, "orders.>")
				n := &naive{pool: pool, js: js, mode: m}
				measureConsumer(b, js, envelopes(orderEvents(b, b.N)), n, n.processed.Load)
			})
		}
	}
}

// naive consumes like the inbox consumer, minus the claim.
type naive struct {
	pool      *pgxpool.Pool
	js        jetstream.JetStream
	mode      consumerMode
	processed atomic.Int64
}

func (n *naive) Run(ctx context.Context) error {
	cons, err := n.js.Consumer(ctx, streams.Orders, benchConsumer)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for range n.mode.workers {
		// As the inbox does: batches as they arrive, and on cancellation the
		// messages on their way processed to the end.
		g.Go(func() error {
			wctx, stop := context.WithCancelCause(gctx)
			defer stop(nil)
			work := context.WithoutCancel(gctx)
			var failed error
			err := jsbatch.Consume(wctx, cons, batchSize, quiet, func(msgs []jetstream.Msg) {
				if failed == nil {
					if failed = n.process(work, msgs); failed != nil {
						stop(failed)
					}
				}
			})
			return errors.Join(err, failed)
		})
	}
	return g.Wait()
}

func (n *naive) process(ctx context.Context, msgs []jetstream.Msg) error {
	if len(msgs) == 0 {
		return nil
	}
	evs := make([]event.Envelope, len(msgs))
	for i, msg := range msgs {
		ev, err := event.FromMsg(msg.Headers(), msg.Data())
		if err != nil {
			return err
		}
		evs[i] = ev
	}
	switch {
	case !n.mode.batched:
		// A transaction each, acked together, as the inbox does.
		for _, ev := range evs {
			if err := inTx(ctx, n.pool, func(tx pgx.Tx) error { return handleDebit(ctx, tx, ev) }); err != nil {
				return err
			}
		}
	case n.mode.setBased:
		err := inTx(ctx, n.pool, func(tx pgx.Tx) error {
			// Planned for its arrays, as the inbox plans a set-based
			// batch's statements: an :exec, queued ahead of the debit.
			if _, err := tx.Exec(ctx, planEachCallSQL); err != nil {
				return err
			}
			return handleDebits(ctx, tx, evs, nil)
		})
		if err != nil {
			return err
		}
	default:
		// In turn on one transaction, as the inbox does when no handler
		// fails.
		err := inTx(ctx, n.pool, func(tx pgx.Tx) error {
			for _, ev := range evs {
				if err := handleDebit(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, msg := range msgs {
		if err := msg.Ack(); err != nil {
			return err
		}
		n.processed.Add(1)
	}
	return nil
}

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/onceflow/onceflow/internal/jsbatch"
	"github.com/onceflow/onceflow/internal/streams"
)

// syncAlwaysJetStream returns a JetStream client of an embedded server of
// its own that fsyncs every write (sync_interval: always), the durable
// setting for a single node.
func syncAlwaysJetStream(b testing.TB) jetstream.JetStream {
	b.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: b.TempDir(),
		SyncAlways: true, NoLog: true, NoSigs: true,
	})
	require.NoError(b, err)
	srv.Start()
	b.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	require.True(b, srv.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(b, err)
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	require.NoError(b, err)
	return js
}

// brokers are the NATS servers the broker-bound benchmarks run on.
var brokers = []struct {
	name string
	js   func(testing.TB) jetstream.JetStream
}{
	{"default", newJetStream},
	{"always", syncAlwaysJetStream},
}

// BenchmarkBroker is the broker's limit, without a database: async publishes
// with Nats-Msg-Id and their acks, and a pull consumer consuming and acking
// (as the inbox consumer does, package jsbatch), on a server with the
// default fsync interval and on one that fsyncs every write.
func BenchmarkBroker(b *testing.B) {
	for _, nb := range brokers {
		b.Run(fmt.Sprintf("op=publish/fsync=%s", nb.name), func(b *testing.B) {
			js := nb.js(b)
			provisionOrders(b, js, streams.Orders, "orders.>")
			msgs := messages(b, envelopes(orderEvents(b, b.N)))
			m := measure(b)
			require.NoError(b, publishAll(context.Background(), js, msgs))
			m.stop()
			m.report(b.N)
		})
		// Atomic batch publishing (nats-server 2.12+) stores a batch with
		// one fsync under sync_interval: always, but stages it first in a
		// file store of its own: the relay's batches are too small for it
		// to pay (docs/performance.md).
		for _, size := range []int{4, 100} {
			b.Run(fmt.Sprintf("op=atomic-publish/batch=%d/fsync=%s", size, nb.name), func(b *testing.B) {
				js := nb.js(b)
				_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
					Name: streams.Orders, Subjects: []string{"orders.>"}, AllowAtomicPublish: true,
				})
				require.NoError(b, err)
				msgs := messages(b, envelopes(orderEvents(b, b.N)))
				m := measure(b)
				for lo := 0; lo < len(msgs); lo += size {
					// As the relay publishes them (outbox.Relay.publishAtomic).
					_, err := jetstreamext.PublishMsgBatch(context.Background(), js, msgs[lo:min(lo+size, len(msgs))], jetstreamext.BatchFlowControl{})
					require.NoError(b, err)
				}
				m.stop()
				m.report(b.N)
			})
		}
		b.Run(fmt.Sprintf("op=consume/fsync=%s", nb.name), func(b *testing.B) {
			js := nb.js(b)
			provisionOrders(b, js, streams.Orders, "orders.>")
			require.NoError(b, publishAll(context.Background(), js, messages(b, envelopes(orderEvents(b, b.N)))))
			cons, err := js.Consumer(context.Background(), streams.Orders, benchConsumer)
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m := measure(b)
			acked := 0
			// As the inbox consumes.
			err = jsbatch.Consume(ctx, cons, batchSize, quiet, func(msgs []jetstream.Msg) {
				for _, msg := range msgs {
					require.NoError(b, msg.Ack())
				}
				if acked += len(msgs); acked >= b.N {
					cancel()
				}
			})
			require.NoError(b, err)
			require.NoError(b, js.Conn().Flush())
			m.stop()
			m.report(b.N)
		})
	}
}

package bench

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// fillOutbox writes n PaymentDebited rows to the outbox, as producers would.
func fillOutbox(b testing.TB, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	ds := orderEvents(b, n)
	for start := 0; start < n; start += 1000 {
		err := inTx(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]event.Envelope, 0, 1000)
			for _, d := range ds[start:min(start+1000, n)] {
				var p event.OrderPlacedV1
				if err := d.ev.Decode(&p); err != nil {
					return err
				}
				ev, err := d.ev.Caused("payment", event.PaymentDebited, event.PaymentDebitedV1{Order: p.Order, Lines: p.Lines, AmountCents: p.TotalCents})
				if err != nil {
					return err
				}
				evs = append(evs, ev)
			}
			return outbox.EnqueueBatch(ctx, tx, evs)
		})
		require.NoError(b, err)
	}
}

// BenchmarkRelay is the outbox relay: rows/s from a pre-filled outbox to
// acknowledged JetStream publishes, marked sent and committed.
func BenchmarkRelay(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, nb := range brokers {
			relay := func(b *testing.B, cfg outbox.RelayConfig) {
				pool := pg.newDB(b, schemaOf(b, ""))
				js := nb.js(b)
				require.NoError(b, streams.Provision(context.Background(), js, streams.Saga(streams.Config{})))
				fillOutbox(b, pool, b.N)
				r := outbox.NewRelay(pool, js, cfg, quiet)
				m := measure(b)
				n, err := r.Flush(context.Background())
				m.stop()
				require.NoError(b, err)
				require.Equal(b, b.N, n)
				m.report(b.N)
			}
			// The pipelined relay, as the services run it.
			b.Run(fmt.Sprintf("pg=%s/fsync=%s", pg.name, nb.name), func(b *testing.B) {
				relay(b, outbox.RelayConfig{Pipelined: true})
			})
			// The plain relay, a generated service's.
			b.Run(fmt.Sprintf("pg=%s/fsync=%s/relay=plain", pg.name, nb.name), func(b *testing.B) {
				relay(b, outbox.RelayConfig{})
			})
			// As the services run it (OUTBOX_ATOMIC_BATCH_MIN), which
			// pays where JetStream fsyncs every write.
			if nb.name == "always" {
				b.Run(fmt.Sprintf("pg=%s/fsync=%s/publish=atomic", pg.name, nb.name), func(b *testing.B) {
					relay(b, outbox.RelayConfig{AtomicBatchMin: 32, Pipelined: true})
				})
			}
		}
	}
}

// BenchmarkWatermill is a peer baseline for the relay: Watermill's
// forwarder, the outbox of the Watermill ecosystem, reading a pre-filled
// watermill-sql (v3, PostgreSQL) table and publishing to JetStream with
// watermill-nats (v2) with TrackMsgId, the message id as Nats-Msg-Id.
// Both are configured with their defaults otherwise.
func BenchmarkWatermill(b *testing.B) {
	for _, pg := range pgTargets(b) {
		b.Run(fmt.Sprintf("pg=%s/fsync=default", pg.name), func(b *testing.B) {
			ctx := context.Background()
			db := stdlib.OpenDBFromPool(pg.newDB(b, schemaOf(b, "")))
			b.Cleanup(func() { _ = db.Close() })
			js := newJetStream(b)
			require.NoError(b, streams.Provision(ctx, js, streams.Saga(streams.Config{})))
			logger := watermill.NopLogger{}
			fill(b, db, b.N, logger)

			sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
				SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{},
				OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
				InitializeSchema: true,
			}, logger)
			require.NoError(b, err)
			pub, err := wmnats.NewPublisherWithNatsConn(js.Conn(), wmnats.PublisherPublishConfig{
				Marshaler:         &wmnats.NATSMarshaler{},
				SubjectCalculator: wmnats.DefaultSubjectCalculator,
				JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
			}, logger)
			require.NoError(b, err)
			fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{})
			require.NoError(b, err)
			stream, err := js.Stream(ctx, streams.Payments)
			require.NoError(b, err)

			done := make(chan error, 1)
			m := measure(b)
			go func() { done <- fwd.Run(context.Background()) }()
			awaitCount(b, int64(b.N), func() int64 {
				info, err := stream.Info(ctx)
				require.NoError(b, err)
				return int64(info.State.Msgs)
			})
			m.stop()
			require.NoError(b, fwd.Close())
			require.NoError(b, <-done)
			require.NoError(b, sub.Close())
			m.report(b.N)
		})
	}
}

// fill writes n enveloped messages to the forwarder's table, as a producer's
// transactions would.
func fill(b testing.TB, db *sql.DB, n int, logger watermill.LoggerAdapter) {
	b.Helper()
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{
		SchemaAdapter:        wmsql.DefaultPostgreSQLSchema{},
		AutoInitializeSchema: true,
	}, logger)
	require.NoError(b, err)
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{})
	subject, err := event.PaymentDebited.NATSSubject()
	require.NoError(b, err)
	ds := orderEvents(b, n)
	for start := 0; start < n; start += 1000 {
		var msgs []*message.Message
		for _, d := range ds[start:min(start+1000, n)] {
			msgs = append(msgs, message.NewMessage(d.ev.ID.String(), message.Payload(d.ev.Data)))
		}
		require.NoError(b, pub.Publish(subject, msgs...))
	}
}

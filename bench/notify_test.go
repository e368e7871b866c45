package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/services/notify"
)

// milestoneEvents returns n order milestones as the saga emits them: each
// order's OrderPlaced followed by its outcome, mostly OrderConfirmed, so
// about two events and two e-mails per order.
func milestoneEvents(b testing.TB, n int) []event.Envelope {
	b.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), 3))
	evs := make([]event.Envelope, 0, n+1)
	for _, d := range orderEvents(b, (n+1)/2) {
		var p event.OrderPlacedV1
		require.NoError(b, d.ev.Decode(&p))
		var (
			next event.Envelope
			err  error
		)
		switch r := rng.IntN(10); {
		case r == 0:
			next, err = d.ev.Caused("order", event.OrderRejected, event.OrderRejectedV1{Order: p.Order, Reason: "insufficient funds"})
		case r == 1:
			next, err = d.ev.Caused("order", event.OrderCancelled, event.OrderCancelledV1{Order: p.Order, Reason: "out of stock"})
		default:
			next, err = d.ev.Caused("order", event.OrderConfirmed, event.OrderConfirmedV1{Order: p.Order, TotalCents: p.TotalCents})
		}
		require.NoError(b, err)
		evs = append(evs, d.ev, next)
	}
	return evs[:n]
}

// BenchmarkNotify is notify's order milestone handler through the batched
// inbox consumer: decode the milestone, write its e-mail to the
// notifications table; per event under savepoints, and set-based.
func BenchmarkNotify(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, m := range serviceModes {
			b.Run(fmt.Sprintf("pg=%s/mode=%s", pg.name, m.name), func(b *testing.B) {
				pool := pg.newDB(b, schemaOf(b, notify.Name))
				js := newJetStream(b)
				provisionOrders(b, js, streams.Orders, "orders.>")
				s := notify.New(pool)
				cfg := inbox.Config{Stream: streams.Orders, Durable: benchConsumer, BatchSize: batchSize, Batched: true, Workers: m.workers}
				if m.setBased {
					cfg.BatchHandler = s.HandleOrderMilestoneBatch
				}
				c := inbox.New(pool, js, cfg, s.HandleOrderMilestone, quiet)
				measureConsumer(b, js, milestoneEvents(b, b.N), c, func() int64 { return c.Stats().Processed })
				requireNotifications(b, pool, "PENDING", b.N)
			})
		}
	}
}

// mailerModes are the mailer's batching: one e-mail per transaction, as it
// was, and its defaults.
var mailerModes = []struct {
	name        string
	batchSize   int
	concurrency int
}{{"batch=1/concurrency=1", 1, 1}, {"batch=64/concurrency=8", 64, 8}}

// sendLatencies are the simulated times an SMTP server takes to accept an
// e-mail: none (the database's part alone) and a relay on the same network.
var sendLatencies = []time.Duration{0, time.Millisecond}

// sleepSender accepts every e-mail after a fixed delay.
type sleepSender struct{ latency time.Duration }

func (s sleepSender) Send(context.Context, notify.Message) error {
	if s.latency > 0 {
		time.Sleep(s.latency)
	}
	return nil
}

// BenchmarkNotifyMailer is the mailer draining a backlog of due e-mails:
// claim, send, mark SENT, commit; one e-mail per transaction, and batches
// sent concurrently.
func BenchmarkNotifyMailer(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, lat := range sendLatencies {
			for _, m := range mailerModes {
				b.Run(fmt.Sprintf("pg=%s/send=%s/mode=%s", pg.name, lat, m.name), func(b *testing.B) {
					pool := pg.newDB(b, schemaOf(b, notify.Name))
					fillNotifications(b, pool, b.N)
					mailer := notify.NewMailer(pool, sleepSender{latency: lat}, notify.MailerConfig{
						BatchSize: m.batchSize, Concurrency: m.concurrency,
					}, quiet)
					m := measure(b)
					n, err := mailer.SendDue(context.Background())
					m.stop()
					require.NoError(b, err)
					require.Equal(b, b.N, n)
					m.report(n)
					requireNotifications(b, pool, "SENT", b.N)
				})
			}
		}
	}
}

// fillNotifications writes n due e-mails.
func fillNotifications(b testing.TB, pool *pgxpool.Pool, n int) {
	b.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body)
		SELECT gen_random_uuid(), 'placed', format('c%s@example.com', e.i), e.id, format('<%s@onceflow>', e.id),
		       'We received your order', 'We received your order (total 3.75).'
		FROM (SELECT i, gen_random_uuid() AS id FROM generate_series(1, $1) AS i) AS e
		ORDER BY e.i`, n)
	require.NoError(b, err)
}

// requireNotifications checks that there are n notifications, all in
// status.
func requireNotifications(b testing.TB, pool *pgxpool.Pool, status string, n int) {
	b.Helper()
	var all, in int
	require.NoError(b, pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE status = $1) FROM notifications`, status).Scan(&all, &in))
	require.Equal(b, n, all)
	require.Equal(b, n, in)
}

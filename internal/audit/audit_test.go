package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/dlq"
	"github.com/onceflow/onceflow/internal/dlq/dlqtest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// settle is how long an audit may wait for the system to go quiet.
const settle = time.Minute

// TestAudit runs the whole system once, places orders of every outcome, and
// audits it: all checks hold. Then it breaks one invariant at a time
// directly in a database (or on the broker), audits again without waiting,
// expects exactly the matching checks to fail, repairs the damage, and
// expects a clean audit again.
//
// It is not parallel: the command-line subtest sets environment variables.
func TestAudit(t *testing.T) {
	s := startSaga(t)

	t.Run("clean", func(t *testing.T) {
		report := s.audit(t, settle)
		requireClean(t, report)
		orders, _ := report.Find(audit.CheckOrders)
		require.Equal(t, map[string]int64{"CONFIRMED": 2, "REJECTED": 1, "CANCELLED": 1}, orders.Figure("orders by status"))
		money, _ := report.Find(audit.CheckMoney)
		require.Equal(t, int64(105_000), money.Figure("credited cents"))
		require.Equal(t, int64(360+1240), money.Figure("debited cents (not refunded)"))
		require.Equal(t, int64(500), money.Figure("refunded cents"))
		require.Equal(t, int64(0), money.Figure("balances + debited - credited"))
		consumers, _ := report.Find(audit.CheckConsumers)
		for _, c := range streams.Saga(streams.Config{}).Consumers {
			require.Equal(t, int64(0), consumers.Figure("dlq entries").(map[string]int64)[c.Durable], c.Durable)
		}
		var out bytes.Buffer
		require.NoError(t, report.Print(&out))
		require.Contains(t, out.String(), "All 11 checks hold.")
		t.Logf("clean audit:\n%s", out.String())
	})

	tests := []struct {
		name string
		// corrupt breaks something and returns how to repair it.
		corrupt func(t *testing.T) (repair func())
		// want are the checks that must fail, in report order.
		want []string
		// violation is a part of one violation's text.
		violation string
	}{
		{
			name: "money appears in a wallet",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents + 100 WHERE customer_id = 'bob'`)
				return func() {
					s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents - 100 WHERE customer_id = 'bob'`)
				}
			},
			want:      []string{audit.CheckMoney},
			violation: `wallet "bob": balance 5100 + debited 0 = 5100 cents, but its credits sum to 5000 (+100)`,
		},
		{
			name: "a debit for an order that does not exist",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents - 700 WHERE customer_id = 'bob'`)
				s.exec(t, "payment", `INSERT INTO payments (order_id, customer_id, amount_cents, status) VALUES ('00000000-0000-7000-8000-000000000001', 'bob', 700, 'DEBITED')`)
				return func() {
					s.exec(t, "payment", `DELETE FROM payments WHERE order_id = '00000000-0000-7000-8000-000000000001'`)
					s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents + 700 WHERE customer_id = 'bob'`)
				}
			},
			want:      []string{audit.CheckDebits},
			violation: `payment DEBITED of "bob" (700 cents) is for an unknown order 00000000-0000-7000-8000-000000000001`,
		},
		{
			// The order's status then contradicts its facts as well: two
			// invariants break at once.
			name: "a refund without a StockRejected",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "payment", `UPDATE payments SET status = 'REFUNDED', refunded_at = now() WHERE order_id = $1`, s.confirmed)
				s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents + 360 WHERE customer_id = 'alice'`)
				return func() {
					s.exec(t, "payment", `UPDATE payments SET status = 'DEBITED', refunded_at = NULL WHERE order_id = $1`, s.confirmed)
					s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents - 360 WHERE customer_id = 'alice'`)
				}
			},
			want:      []string{audit.CheckRefunds, audit.CheckOrders},
			violation: fmt.Sprintf("payment of order %s is REFUNDED without a StockRejected or an expiry (reservation: RESERVED)", s.confirmed),
		},
		{
			name: "a StockRejected never refunded",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "payment", `UPDATE payments SET status = 'DEBITED', refunded_at = NULL WHERE order_id = $1`, s.cancelled)
				s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents - 500 WHERE customer_id = 'alice'`)
				return func() {
					s.exec(t, "payment", `UPDATE payments SET status = 'REFUNDED', refunded_at = now() WHERE order_id = $1`, s.cancelled)
					s.exec(t, "payment", `UPDATE wallets SET balance_cents = balance_cents + 500 WHERE customer_id = 'alice'`)
				}
			},
			want:      []string{audit.CheckRefunds, audit.CheckOrders},
			violation: fmt.Sprintf("stock of order %s was rejected but its payment is DEBITED, not refunded", s.cancelled),
		},
		{
			name: "an order set back to PENDING",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "order", `UPDATE orders SET status = 'PENDING' WHERE id = $1`, s.confirmed)
				return func() { s.exec(t, "order", `UPDATE orders SET status = 'CONFIRMED' WHERE id = $1`, s.confirmed) }
			},
			want:      []string{audit.CheckOrders},
			violation: fmt.Sprintf("order %s is PENDING, but payment DEBITED and reservation RESERVED make it CONFIRMED", s.confirmed),
		},
		{
			name: "an order open past its deadline",
			corrupt: func(t *testing.T) func() {
				// The running expirer would end the order; a key-share lock
				// keeps it off (its FOR UPDATE SKIP LOCKED skips the row)
				// without blocking the update.
				tx, err := s.dbs["order"].Begin(t.Context())
				require.NoError(t, err)
				_, err = tx.Exec(t.Context(), `SELECT 1 FROM orders WHERE id = $1 FOR KEY SHARE`, s.confirmed)
				require.NoError(t, err)
				s.exec(t, "order", `UPDATE orders SET status = 'PENDING', deadline = now() - interval '1 hour' WHERE id = $1`, s.confirmed)
				return func() {
					s.exec(t, "order", `UPDATE orders SET status = 'CONFIRMED', deadline = created_at + interval '15 minutes' WHERE id = $1`, s.confirmed)
					require.NoError(t, tx.Rollback(t.Context()))
				}
			},
			want:      []string{audit.CheckOrders, audit.CheckDeadlines},
			violation: fmt.Sprintf("order %s is still PENDING 1h0m", s.confirmed),
		},
		{
			// An expiry that did not compensate: the money and the stock
			// stayed taken.
			name: "an expired order that kept its money and stock",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "order", `UPDATE orders SET status = 'EXPIRED' WHERE id = $1`, s.confirmed)
				return func() { s.exec(t, "order", `UPDATE orders SET status = 'CONFIRMED' WHERE id = $1`, s.confirmed) }
			},
			want:      []string{audit.CheckDeadlines, audit.CheckEvents, audit.CheckNotifications},
			violation: fmt.Sprintf("order %s expired, but its payment is DEBITED", s.confirmed),
		},
		{
			name: "a late reply with the wrong fate",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "order", `INSERT INTO order_timeline (order_id, event_id, event_type, at, late)
					VALUES ($1, '00000000-0000-7000-8000-000000000002', 'onceflow.payment.debited.v1', now(), 'refunded')`, s.confirmed)
				return func() {
					s.exec(t, "order", `DELETE FROM order_timeline WHERE event_id = '00000000-0000-7000-8000-000000000002'`)
				}
			},
			want:      []string{audit.CheckDeadlines},
			violation: fmt.Sprintf("onceflow.payment.debited.v1 00000000-0000-7000-8000-000000000002 of CONFIRMED order %s is recorded refunded, not unchanged", s.confirmed),
		},
		{
			// The schema forbids it; a bad migration could drop the check.
			name: "a negative stock level",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "inventory", `ALTER TABLE stock DROP CONSTRAINT stock_available_check`)
				s.exec(t, "inventory", `UPDATE stock SET available = -1 WHERE sku = 'plum'`)
				return func() {
					s.exec(t, "inventory", `UPDATE stock SET available = 0 WHERE sku = 'plum'`)
					s.exec(t, "inventory", `ALTER TABLE stock ADD CONSTRAINT stock_available_check CHECK (available >= 0)`)
				}
			},
			want:      []string{audit.CheckStock},
			violation: `sku "plum" has -1 available`,
		},
		{
			// What a retried absolute PUT did before stock was a ledger:
			// units back on the shelf that a reservation took.
			name: "a stock level that does not add up",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "inventory", `UPDATE stock SET available = available + 3 WHERE sku = 'apple'`)
				return func() { s.exec(t, "inventory", `UPDATE stock SET available = available - 3 WHERE sku = 'apple'`) }
			},
			want:      []string{audit.CheckStock},
			violation: `sku "apple": available 98 + reserved 5 = 103, but its movements add up to 100 (+3)`,
		},
		{
			// The other direction: units gone from the shelf that no
			// movement or reservation accounts for (a lost release, a
			// double reservation). A check of "more than the ledger" only
			// lets this pass.
			name: "units lost from the shelf",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "inventory", `UPDATE stock SET available = available - 2 WHERE sku = 'apple'`)
				return func() { s.exec(t, "inventory", `UPDATE stock SET available = available + 2 WHERE sku = 'apple'`) }
			},
			want:      []string{audit.CheckStock},
			violation: `sku "apple": available 93 + reserved 5 = 98, but its movements add up to 100 (-2)`,
		},
		{
			// A movement recorded without its units reaching the shelf:
			// the ledger says more than the stock holds.
			name: "a movement whose units never arrived",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "inventory", `INSERT INTO stock_movements (sku, kind, delta, reason) VALUES ('apple', 'ADJUSTMENT', 4, 'audit test')`)
				return func() {
					s.exec(t, "inventory", `DELETE FROM stock_movements WHERE sku = 'apple' AND reason = 'audit test'`)
				}
			},
			want:      []string{audit.CheckStock},
			violation: `sku "apple": available 95 + reserved 5 = 100, but its movements add up to 104 (-4)`,
		},
		{
			// A second OrderConfirmed under a new id: notify's unique
			// (order, kind) absorbs it, any other subscriber would act
			// twice.
			name: "a second terminal event",
			corrupt: func(t *testing.T) func() {
				return s.republish(t, event.OrderConfirmed, s.confirmed)
			},
			want:      []string{audit.CheckEvents},
			violation: fmt.Sprintf("order %s has 2 terminal events: CONFIRMED ", s.confirmed),
		},
		{
			name: "a second PaymentDebited",
			corrupt: func(t *testing.T) func() {
				return s.republish(t, event.PaymentDebited, s.confirmed)
			},
			want:      []string{audit.CheckEvents},
			violation: fmt.Sprintf("order %s has 2 onceflow.payment.debited.v1 events with different ids: ", s.confirmed),
		},
		{
			name: "more reserved than ordered",
			corrupt: func(t *testing.T) func() {
				// The unit came off the shelf too: stock is conserved.
				s.exec(t, "inventory", `UPDATE reservation_lines SET quantity = quantity + 1 WHERE order_id = $1`, s.confirmed)
				s.exec(t, "inventory", `UPDATE stock SET available = available - 1 WHERE sku = 'apple'`)
				return func() {
					s.exec(t, "inventory", `UPDATE reservation_lines SET quantity = quantity - 1 WHERE order_id = $1`, s.confirmed)
					s.exec(t, "inventory", `UPDATE stock SET available = available + 1 WHERE sku = 'apple'`)
				}
			},
			want:      []string{audit.CheckReservations},
			violation: fmt.Sprintf("order %s: reserved 4 apple, ordered 3 apple", s.confirmed),
		},
		{
			name: "reservation lines without a reservation",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "inventory", `INSERT INTO reservation_lines (order_id, sku, quantity) VALUES ('00000000-0000-7000-8000-000000000004', 'apple', 2)`)
				s.exec(t, "inventory", `UPDATE stock SET available = available - 2 WHERE sku = 'apple'`)
				return func() {
					s.exec(t, "inventory", `DELETE FROM reservation_lines WHERE order_id = '00000000-0000-7000-8000-000000000004'`)
					s.exec(t, "inventory", `UPDATE stock SET available = available + 2 WHERE sku = 'apple'`)
				}
			},
			want:      []string{audit.CheckReservations},
			violation: "order 00000000-0000-7000-8000-000000000004: 2 apple reserved without a reservation",
		},
		{
			name: "an outbox row left unsent",
			corrupt: func(t *testing.T) func() {
				// A row on a subject no stream takes cannot be published:
				// the relay is stuck on it, as on a broker that refuses it.
				s.exec(t, "order", `INSERT INTO outbox (event_id, event_type, source, subject, nats_subject, event_time, data)
					VALUES ('00000000-0000-7000-8000-000000000002', 'onceflow.order.placed.v1', 'order',
					        '00000000-0000-7000-8000-000000000003', 'audit-test.no-stream', now(), '{}')`)
				return func() {
					s.exec(t, "order", `DELETE FROM outbox WHERE event_id = '00000000-0000-7000-8000-000000000002'`)
				}
			},
			want:      []string{audit.CheckOutbox},
			violation: "order outbox row",
		},
		{
			name: "a second terminal e-mail",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "notify", `INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body, status, attempts, sent_at)
					VALUES ($1, 'rejected', 'alice@example.com', '00000000-0000-7000-8000-000000000004', '<x@onceflow>', 's', 'b', 'SENT', 1, now())`, s.confirmed)
				return func() {
					s.exec(t, "notify", `DELETE FROM notifications WHERE event_id = '00000000-0000-7000-8000-000000000004'`)
				}
			},
			want:      []string{audit.CheckNotifications},
			violation: fmt.Sprintf("order %s is CONFIRMED but has a rejected e-mail", s.confirmed),
		},
		{
			name: "an e-mail that failed",
			corrupt: func(t *testing.T) func() {
				s.exec(t, "notify", `UPDATE notifications SET status = 'FAILED', sent_at = NULL, last_error = 'smtp: 550 mailbox unavailable'
					WHERE order_id = $1 AND kind = 'placed'`, s.rejected)
				return func() {
					s.exec(t, "notify", `UPDATE notifications SET status = 'SENT', sent_at = now(), last_error = ''
						WHERE order_id = $1 AND kind = 'placed'`, s.rejected)
				}
			},
			want:      []string{audit.CheckNotifications},
			violation: "is FAILED: smtp: 550 mailbox unavailable",
		},
		{
			// The event was acked, but its effect (the inbox row, and with
			// it the handler's writes) is gone: what acking before
			// committing leaves behind after a crash.
			name: "an event acked without its inbox row",
			corrupt: func(t *testing.T) func() {
				var (
					eventType     string
					eventTime, at time.Time
					streamSeq     int64
				)
				require.NoError(t, s.dbs["notify"].QueryRow(t.Context(), `
					DELETE FROM processed_events WHERE consumer = 'notify-orders' AND event_id = $1
					RETURNING event_type, event_time, stream_seq, processed_at`, s.confirmedPlaced).Scan(&eventType, &eventTime, &streamSeq, &at))
				return func() {
					s.exec(t, "notify", `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, processed_at, minted_at)
						VALUES ('notify-orders', $1, $2, $3, $4, $5, uuid7_time($1))`, s.confirmedPlaced, eventType, eventTime, streamSeq, at)
				}
			},
			want:      []string{audit.CheckConsumers},
			violation: fmt.Sprintf("(orders.placed.v1, event %s) was acked, but it has no inbox row and no DLQ entry", s.confirmedPlaced),
		},
		{
			// Both subscribers of payments.debited.v1 are paused, so the
			// message waits; resumed, they dead-letter it (it is no event).
			name: "events nobody processed",
			corrupt: func(t *testing.T) func() {
				for _, durable := range []string{streams.InventoryPayments, streams.OrderPayments} {
					_, err := s.js.PauseConsumer(t.Context(), streams.Payments, durable, time.Now().Add(time.Hour))
					require.NoError(t, err)
				}
				_, err := s.payment.Publish(t.Context(), "payments.debited.v1", []byte("not an event"))
				require.NoError(t, err)
				return func() {
					for _, durable := range []string{streams.InventoryPayments, streams.OrderPayments} {
						_, err := s.js.ResumeConsumer(t.Context(), streams.Payments, durable)
						require.NoError(t, err)
					}
				}
			},
			want:      []string{audit.CheckConsumers},
			violation: streams.InventoryPayments + ": 1 message not yet delivered",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repair := tt.corrupt(t)
			report := s.audit(t, 0)
			repair()
			require.Equal(t, tt.want, report.Failed(), printed(t, report))
			var all []string
			for _, name := range tt.want {
				c, _ := report.Find(name)
				all = append(all, c.Violations...)
			}
			require.Contains(t, strings.Join(all, "\n"), tt.violation)

			requireClean(t, s.audit(t, settle))
		})
	}

	// The junk published by "events nobody processed" is in the DLQ now:
	// figures, not violations.
	t.Run("dead letters are figures", func(t *testing.T) {
		report := s.audit(t, settle)
		requireClean(t, report)
		consumers, _ := report.Find(audit.CheckConsumers)
		dlq := consumers.Figure("dlq entries").(map[string]int64)
		require.Equal(t, int64(1), dlq[streams.InventoryPayments])
		require.Equal(t, int64(1), dlq[streams.OrderPayments])
		require.Contains(t, consumers.Figure(streams.OrderPayments+" DLQ reasons"), "1× ")
	})

	// An event processed, then dead-lettered (a consumer that gave up on a
	// delivery whose commit had in fact happened), then replayed: the
	// replay is a duplicate, and the event is verified once.
	t.Run("a replayed event counts once", func(t *testing.T) {
		ctx := t.Context()
		figures := func(report audit.Report) map[string]int64 {
			consumers, _ := report.Find(audit.CheckConsumers)
			for _, f := range consumers.Figures {
				if strings.HasPrefix(f.Name, streams.InventoryPayments+" (") {
					return f.Value.(map[string]int64)
				}
			}
			t.Fatalf("no figures of %s", streams.InventoryPayments)
			return nil
		}
		before := figures(s.audit(t, settle))
		st, err := s.js.Stream(ctx, streams.Payments)
		require.NoError(t, err)
		var seq uint64
		require.NoError(t, s.dbs["inventory"].QueryRow(ctx, `SELECT p.stream_seq FROM processed_events p
			WHERE p.consumer = $1 AND p.event_type = 'onceflow.payment.debited.v1' ORDER BY p.stream_seq LIMIT 1`, streams.InventoryPayments).Scan(&seq))
		last, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		id := dlqtest.DeadLetterMsg(t, s.js, &nats.Msg{Subject: last.Subject, Header: last.Header, Data: last.Data},
			streams.Payments, last.Sequence, streams.InventoryPayments, "failed on each of 10 deliveries, the last: commit: connection reset")
		_, err = dlq.New(s.js, dlq.Config{Topology: streams.Saga(streams.Config{})}).Replay(ctx, id, dlq.ReplayOptions{By: "test"})
		require.NoError(t, err)

		report := s.audit(t, settle)
		requireClean(t, report)
		after := figures(report)
		require.Equal(t, int64(1), after["replays"])
		require.Equal(t, before["verified"], after["verified"], "the replayed event is verified once")
		require.Equal(t, before["inbox_rows"], after["inbox_rows"], "the replay was a duplicate")
		require.Equal(t, before["messages"]+1, after["messages"])
	})

	t.Run("command", func(t *testing.T) {
		t.Setenv("ORDER_DATABASE_URL", s.urls["order"])
		t.Setenv("PAYMENT_DATABASE_URL", s.urls["payment"])
		t.Setenv("INVENTORY_DATABASE_URL", s.urls["inventory"])
		t.Setenv("NOTIFY_DATABASE_URL", s.urls["notify"])
		t.Setenv("NATS_URL", s.env.NATSURL)
		t.Setenv("NATS_CREDS", s.env.NATSCreds[streams.Operator])
		var stdout, stderr bytes.Buffer
		require.NoError(t, cli.Run(t.Context(), []string{"audit", "--wait", "30s"}, &stdout, &stderr), stderr.String())
		require.Contains(t, stdout.String(), "ok    money ")
		require.Contains(t, stdout.String(), "All 11 checks hold.")

		s.exec(t, "order", `UPDATE orders SET status = 'PAID' WHERE id = $1`, s.confirmed)
		defer s.exec(t, "order", `UPDATE orders SET status = 'CONFIRMED' WHERE id = $1`, s.confirmed)
		stdout.Reset()
		err := cli.Run(t.Context(), []string{"audit", "--wait", "0s"}, &stdout, &stderr)
		// The order's second PaymentDebited (a case above) is in its
		// timeline as late: on an open order, that is a violation too.
		require.EqualError(t, err, "audit: 2 violations in 2 of 11 checks (orders, deadlines)")
		require.Contains(t, stdout.String(), "FAIL  orders ")
		require.Contains(t, stdout.String(), fmt.Sprintf("✗ order %s is PAID, but payment DEBITED and reservation RESERVED make it CONFIRMED", s.confirmed))
		t.Logf("failed audit:\n%s", stdout.String())
	})
}

// saga is a running system with one order of every outcome.
type saga struct {
	env  *dev.Env
	urls map[string]string // database URL per service
	dbs  map[string]*pgxpool.Pool
	// js has every right (dev.Config.TestAdmin), payment is the payment
	// service's.
	js, payment jetstream.JetStream
	// Orders: confirmed (alice, 3 apples), rejected for funds (bob),
	// cancelled for stock (alice, a plum) and refunded.
	confirmed, rejected, cancelled string
	// confirmedPlaced is the id of the confirmed order's OrderPlaced.
	confirmedPlaced uuid.UUID
}

func startSaga(t *testing.T) *saga {
	t.Helper()
	e, err := dev.Start(t.Context(), onServer(t), testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	_, err = dev.Seed(t.Context(), e)
	require.NoError(t, err)

	s := &saga{env: e, urls: map[string]string{}, dbs: map[string]*pgxpool.Pool{}}
	for _, svc := range e.Services {
		s.urls[svc.Name] = svc.DatabaseURL
		pool, err := postgres.Connect(t.Context(), svc.DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s.dbs[svc.Name] = pool
	}
	// With every right, to corrupt the system on purpose; the payment
	// service publishes the poison below.
	s.js, s.payment = connectAs(t, e, natsauth.Admin), connectAs(t, e, "payment")

	// At the seeded catalog's prices: apple 120, pear 1000, plum 500.
	s.confirmed = placeOrder(t, e, "alice", `{"sku":"apple","quantity":3}`)
	s.rejected = placeOrder(t, e, "bob", `{"sku":"pear","quantity":10}`) // 10000 > 5000
	s.cancelled = placeOrder(t, e, "alice", `{"sku":"plum","quantity":1}`)
	placeOrder(t, e, "alice", `{"sku":"apple","quantity":2},{"sku":"pear","quantity":1}`)
	require.NoError(t, s.dbs["order"].QueryRow(t.Context(),
		`SELECT event_id FROM order_timeline WHERE order_id = $1 AND event_type = 'onceflow.order.placed.v1'`, s.confirmed).Scan(&s.confirmedPlaced))
	return s
}

// connectAs connects to e's NATS as identity.
func connectAs(t *testing.T, e *dev.Env, identity string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(e.NATSURL, natsauth.Client{Creds: e.NATSCreds[identity]}.Options(identity)...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// audit audits s, waiting at most wait for quiet.
func (s *saga) audit(t *testing.T, wait time.Duration) audit.Report {
	t.Helper()
	report, err := audit.Run(t.Context(), audit.Config{
		OrderURL:     s.urls["order"],
		PaymentURL:   s.urls["payment"],
		InventoryURL: s.urls["inventory"],
		NotifyURL:    s.urls["notify"],
		NATSURL:      s.env.NATSURL,
		NATSCreds:    s.env.NATSCreds[streams.Operator],
		Wait:         wait,
		PollInterval: 20 * time.Millisecond,
	}, testLogger(t))
	require.NoError(t, err)
	return report
}

// republish publishes the event of type typ of order again, under a new
// id, as its owner would, waits until its subscribers processed it, and
// returns how to take it off its stream.
func (s *saga) republish(t *testing.T, typ event.Type, order string) (repair func()) {
	t.Helper()
	subject, err := typ.NATSSubject()
	require.NoError(t, err)
	stream, err := s.js.StreamNameBySubject(t.Context(), subject)
	require.NoError(t, err)
	st, err := s.js.Stream(t.Context(), stream)
	require.NoError(t, err)
	last, err := st.GetLastMsgForSubject(t.Context(), subject)
	require.NoError(t, err)
	var first *jetstream.RawStreamMsg
	for seq := last.Sequence; first == nil; seq-- {
		require.NotZero(t, seq, "no %s of order %s on %s", typ, order, stream)
		m, err := st.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // taken off by an earlier repair
		}
		require.NoError(t, err)
		if m.Subject == subject && m.Header.Get(event.HeaderSubject) == order {
			first = m
		}
	}
	again := nats.Header{}
	for k, v := range first.Header {
		again[k] = v
	}
	id := uuid.Must(uuid.NewV7()).String()
	again.Set(event.HeaderID, id)
	again.Set(jetstream.MsgIDHeader, id)
	ack, err := s.js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Header: again, Data: first.Data})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, durable := range streams.Saga(streams.Config{}).Consumers {
			if durable.Stream != stream {
				continue
			}
			cons, err := s.js.Consumer(t.Context(), stream, durable.Durable)
			require.NoError(c, err)
			info := cons.CachedInfo()
			require.Zero(c, info.NumPending+uint64(info.NumAckPending), durable.Durable)
		}
	}, settle, 20*time.Millisecond)
	return func() { require.NoError(t, st.DeleteMsg(context.Background(), ack.Sequence)) }
}

// exec runs sql on the service's database.
func (s *saga) exec(t *testing.T, service, sql string, args ...any) {
	t.Helper()
	_, err := s.dbs[service].Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

func requireClean(t *testing.T, report audit.Report) {
	t.Helper()
	require.Empty(t, report.Unquiet, printed(t, report))
	require.True(t, report.OK(), printed(t, report))
	require.Len(t, report.Checks, 11)
}

func printed(t *testing.T, report audit.Report) string {
	var out bytes.Buffer
	require.NoError(t, report.Print(&out))
	return out.String()
}

// onServer configures dev for the test PostgreSQL server, in databases of
// its own that are dropped when the test ends: much faster than a cluster of
// its own.
func onServer(t *testing.T) dev.Config {
	t.Helper()
	admin := testenv.NewDatabase(t, postgres.Schema{}).AdminURL()
	prefix := fmt.Sprintf("audit%d_", os.Getpid())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer conn.Close(ctx)
		for _, name := range []string{"order", "payment", "inventory", "notify"} {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{prefix + name}.Sanitize()+" WITH (FORCE)")
			require.NoError(t, err)
		}
	})
	return dev.Config{DatabaseURL: admin, DatabasePrefix: prefix, TestAdmin: true}
}

// placeOrder places an order of items (JSON objects) and waits until it is
// terminal; it returns the order's id.
func placeOrder(t *testing.T, e *dev.Env, customer, items string) string {
	t.Helper()
	body := fmt.Sprintf(`{"customer_email":"%s@example.com","items":[%s]}`, customer, items)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.URL("order")+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("audit-%s-%d", customer, time.Now().UnixNano()))
	tok, err := e.Token(customer, false)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var o struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	require.NotEmpty(t, o.ID)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		get, err := http.NewRequest(http.MethodGet, e.URL("order")+"/orders/"+o.ID, nil)
		require.NoError(c, err)
		get.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(get)
		require.NoError(c, err)
		defer resp.Body.Close()
		var got struct {
			Status string `json:"status"`
		}
		require.NoError(c, json.NewDecoder(resp.Body).Decode(&got))
		require.Contains(c, []string{"CONFIRMED", "REJECTED", "CANCELLED"}, got.Status)
	}, 30*time.Second, 20*time.Millisecond, "order %s", o.ID)
	return o.ID
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

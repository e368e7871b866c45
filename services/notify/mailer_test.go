package notify_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/notify"
)

func TestMailerSendsOnceAndMarksSent(t *testing.T) {
	t.Parallel()
	svc, rec := start(t)
	ev := orderPlaced(t, "ida", "ida@shop.example")
	svc.Publish(t, ev)

	n := awaitSettled(t, svc.DB.Pool, orderID(t, ev))
	require.Equal(t, notify.StatusSent, n.Status)
	require.NotNil(t, n.SentAt)
	require.Equal(t, 1, n.Attempts)
	require.Empty(t, n.LastError)

	sent := rec.Calls()
	require.Len(t, sent, 1)
	got := sent[0]
	require.True(t, n.CreatedAt.Equal(got.Date), "dated when written: %s, not %s", n.CreatedAt, got.Date)
	got.Date = time.Time{}
	require.Equal(t, notify.Message{
		ID:      "<" + ev.ID.String() + "@onceflow>",
		To:      "ida@shop.example",
		Subject: n.Subject,
		Body:    n.Body,
	}, got)
}

func TestMailerRetriesThenFails(t *testing.T) {
	t.Parallel()
	svc, rec := start(t, func(c *notify.Config) {
		c.MailerMaxAttempts = 3
		c.MailerRetryBackoff = 10 * time.Millisecond
	})
	rec.FailWith(func(call int) error { return fmt.Errorf("454 try again later (call %d)", call) })
	ev := orderPlaced(t, "jon", "jon@shop.example")
	svc.Publish(t, ev)

	n := awaitSettled(t, svc.DB.Pool, orderID(t, ev))
	require.Equal(t, notify.StatusFailed, n.Status)
	require.Equal(t, 3, n.Attempts)
	require.Equal(t, "454 try again later (call 3)", n.LastError)
	require.Nil(t, n.SentAt)
	require.Len(t, rec.Calls(), 3, "tried MaxAttempts times, then left alone")
	require.Empty(t, rec.Sent())
}

func TestMailerRetriesUntilSent(t *testing.T) {
	t.Parallel()
	svc, rec := start(t, func(c *notify.Config) {
		c.MailerMaxAttempts = 5
		c.MailerRetryBackoff = 10 * time.Millisecond
	})
	// The first two calls fail after the message was handed over, as a
	// crash between the server's acceptance and the commit would look.
	rec.FailWith(func(call int) error {
		if call <= 2 {
			return errors.New("connection reset")
		}
		return nil
	})
	ev := orderPlaced(t, "kim", "kim@shop.example")
	svc.Publish(t, ev)

	n := awaitSettled(t, svc.DB.Pool, orderID(t, ev))
	require.Equal(t, notify.StatusSent, n.Status)
	require.Equal(t, 3, n.Attempts)
	require.Empty(t, n.LastError, "a sent e-mail keeps no error")
	calls := rec.Calls()
	require.Len(t, calls, 3)
	for _, c := range calls[1:] {
		require.Equal(t, calls[0], c, "a resend is the same e-mail, Message-ID and Date included")
	}
}

func TestMailerBacksOffAfterAFailure(t *testing.T) {
	t.Parallel()
	svc, rec := start(t, func(c *notify.Config) { c.MailerRetryBackoff = time.Hour })
	rec.FailWith(func(int) error { return errors.New("down") })
	ev := orderPlaced(t, "lea", "")
	svc.Publish(t, ev)

	var attempts int
	var wait time.Duration
	require.Eventually(t, func() bool {
		err := svc.DB.Pool.QueryRow(t.Context(),
			`SELECT attempts, (extract(epoch FROM next_attempt_at - clock_timestamp()) * 1e9)::bigint
			 FROM notifications WHERE order_id = $1`, orderID(t, ev)).Scan(&attempts, &wait)
		return err == nil && attempts == 1
	}, 20*time.Second, 10*time.Millisecond)
	require.Greater(t, wait, 50*time.Minute, "the next attempt waits for the backoff")
	require.Equal(t, notify.StatusPending, rows(t, svc.DB.Pool, orderID(t, ev))[0].Status)
}

// blockingSender holds the first Send until released, then fails it if its
// context was canceled meanwhile.
type blockingSender struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *blockingSender) Send(ctx context.Context, _ notify.Message) error {
	s.once.Do(func() { close(s.started) })
	<-s.release
	return ctx.Err()
}

func TestMailerFinishesTheEmailInHandOnStop(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, notify.Name)
	_, err := db.Pool.Exec(t.Context(), `
		INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body)
		VALUES (gen_random_uuid(), 'placed', 'x@example.invalid', gen_random_uuid(), '<x@onceflow>', 's', 'b')`)
	require.NoError(t, err)

	sender := &blockingSender{started: make(chan struct{}), release: make(chan struct{})}
	m := notify.NewMailer(db.Pool, sender, notify.MailerConfig{PollInterval: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	select {
	case <-sender.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the mailer did not send")
	}
	cancel()
	close(sender.release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the mailer did not stop")
	}
	var status string
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT status FROM notifications`).Scan(&status))
	require.Equal(t, notify.StatusSent, status, "the e-mail in hand was finished and marked")
}

func TestSMTPSenderWritesTheMessage(t *testing.T) {
	t.Parallel()
	srv := newSMTPServer(t, "250 ok")
	svc, _ := start(t, func(c *notify.Config) {
		c.Sender = nil // the SMTP sender, from SMTPAddr
		c.SMTPAddr = srv.addr
		c.MailFrom = notify.DefaultMailFrom
	})
	ev := orderPlaced(t, "max", "max@shop.example")
	svc.Publish(t, ev)

	n := awaitSettled(t, svc.DB.Pool, orderID(t, ev))
	require.Equal(t, notify.StatusSent, n.Status)
	mails := srv.Mails()
	require.Len(t, mails, 1)
	got := mails[0]
	require.True(t, strings.HasPrefix(got.from, "MAIL FROM:<noreply@onceflow.example>"), got.from)
	require.Equal(t, "RCPT TO:<max@shop.example>", got.rcpt)

	msg, err := textproto.NewReader(bufio.NewReader(strings.NewReader(got.data))).ReadMIMEHeader()
	require.NoError(t, err)
	require.Equal(t, "<"+ev.ID.String()+"@onceflow>", msg.Get("Message-ID"))
	require.Equal(t, `"onceflow" <noreply@onceflow.example>`, msg.Get("From"))
	require.Equal(t, "<max@shop.example>", msg.Get("To"))
	require.Equal(t, n.Subject, msg.Get("Subject"))
	date, err := time.Parse(time.RFC1123Z, msg.Get("Date"))
	require.NoError(t, err)
	require.WithinDuration(t, n.CreatedAt, date, time.Second)
	require.Equal(t, "text/plain; charset=utf-8", msg.Get("Content-Type"))
	require.Contains(t, got.data, orderID(t, ev).String())
}

func TestSMTPSenderReportsRefusal(t *testing.T) {
	t.Parallel()
	srv := newSMTPServer(t, "550 no such user")
	s, err := notify.NewSMTPSender(srv.addr, "ops@onceflow.example")
	require.NoError(t, err)
	err = s.Send(t.Context(), notify.Message{ID: "<a@onceflow>", To: "nobody@shop.example", Subject: "s", Body: "b", Date: time.Now()})
	require.ErrorContains(t, err, "550")
	require.Empty(t, srv.Mails())
}

func TestSMTPSenderHonoursTheContext(t *testing.T) {
	t.Parallel()
	// A server that accepts the connection and never greets.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { require.NoError(t, ln.Close()); wg.Wait() })
	wg.Go(func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(io.Discard, conn) // until the client hangs up
	})

	s, err := notify.NewSMTPSender(ln.Addr().String(), notify.DefaultMailFrom)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err = s.Send(ctx, notify.Message{ID: "<b@onceflow>", To: "x@shop.example", Subject: "s", Body: "b", Date: time.Now()})
	require.Error(t, err)
}

func TestNewSMTPSenderValidates(t *testing.T) {
	t.Parallel()
	_, err := notify.NewSMTPSender("no-port", notify.DefaultMailFrom)
	require.Error(t, err)
	_, err = notify.NewSMTPSender("127.0.0.1:25", "not an address")
	require.Error(t, err)
}

func TestMailerMetrics(t *testing.T) {
	t.Parallel()
	svc, _ := start(t)
	ev := orderPlaced(t, "ned", "")
	svc.Publish(t, ev)
	awaitSettled(t, svc.DB.Pool, orderID(t, ev))

	// The mailer counts a send once its mark committed, a moment after the
	// row reads SENT.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		metrics := get(t, svc.BaseURL+"/metrics")
		assert.Equal(c, http.StatusOK, metrics.status)
		assert.Contains(c, metrics.body, `onceflow_mailer_sends_total{outcome="sent"} 1`)
		assert.Contains(c, metrics.body, "onceflow_mailer_pending 0")
	}, 10*time.Second, 10*time.Millisecond)
}

// smtpServer is just enough of an SMTP server to receive e-mails. RCPT is
// answered with rcptReply.
type smtpServer struct {
	addr      string
	rcptReply string

	mu    sync.Mutex
	mails []smtpMail
}

type smtpMail struct {
	from, rcpt string // the commands as received
	data       string // the message, dot-unstuffed, lines joined by "\r\n"
}

func newSMTPServer(t *testing.T, rcptReply string) *smtpServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &smtpServer{addr: ln.Addr().String(), rcptReply: rcptReply}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { s.serve(conn) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

func (s *smtpServer) Mails() []smtpMail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]smtpMail(nil), s.mails...)
}

func (s *smtpServer) serve(conn net.Conn) {
	defer conn.Close()
	tp := textproto.NewConn(conn)
	reply := func(line string) bool { return tp.PrintfLine("%s", line) == nil }
	if !reply("220 fake ESMTP") {
		return
	}
	var m smtpMail
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb := strings.ToUpper(strings.SplitN(line, " ", 2)[0])
		var ok bool
		switch verb {
		case "EHLO", "HELO":
			ok = reply("250 fake")
		case "MAIL":
			m = smtpMail{from: line}
			ok = reply("250 ok")
		case "RCPT":
			m.rcpt = line
			ok = reply(s.rcptReply)
		case "DATA":
			if !reply("354 go ahead") {
				return
			}
			lines, err := tp.ReadDotLines()
			if err != nil {
				return
			}
			m.data = strings.Join(lines, "\r\n")
			s.mu.Lock()
			s.mails = append(s.mails, m)
			s.mu.Unlock()
			ok = reply("250 queued")
		case "RSET", "NOOP":
			ok = reply("250 ok")
		case "QUIT":
			reply("221 bye")
			return
		default:
			ok = reply("502 not implemented")
		}
		if !ok {
			return
		}
	}
}

// newMailerDB is a notify database with n due notifications, and their
// Message-IDs in id order.
func newMailerDB(t *testing.T, n int) (*testenv.Database, []string) {
	t.Helper()
	db := testenv.NewServiceDatabase(t, notify.Name)
	r, err := db.Pool.Query(t.Context(), `
		INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body)
		SELECT gen_random_uuid(), 'placed', format('c%s@shop.example', e.i), e.id, format('<%s@onceflow>', e.id), 's', 'b'
		FROM (SELECT i, gen_random_uuid() AS id FROM generate_series(1, $1) AS i) AS e
		ORDER BY e.i
		RETURNING message_id`, n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, n)
	return db, ids
}

// awaitNonePending waits until no notification is PENDING.
func awaitNonePending(t *testing.T, db *testenv.Database) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM notifications WHERE status = 'PENDING'`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 10*time.Millisecond)
}

// runMailer runs m until the test ends.
func runMailer(t *testing.T, m *notify.Mailer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// gatedSender holds its first Send until the other's first Send has begun,
// so that each of two mailers sends only while the other holds a batch.
type gatedSender struct {
	rec          *recorder
	first, other chan struct{}
	once         sync.Once
}

func (s *gatedSender) Send(ctx context.Context, m notify.Message) error {
	var err error
	s.once.Do(func() {
		close(s.first)
		select {
		case <-s.other:
		case <-time.After(5 * time.Second):
			err = errors.New("the other mailer sent nothing meanwhile")
		}
	})
	if err != nil {
		return err
	}
	return s.rec.Send(ctx, m)
}

func TestTwoMailersSendEveryNotificationOnce(t *testing.T) {
	t.Parallel()
	const n = 500
	db, ids := newMailerDB(t, n)
	rec := &recorder{}
	a, b := make(chan struct{}), make(chan struct{})
	cfg := notify.MailerConfig{PollInterval: 10 * time.Millisecond, BatchSize: 16, Concurrency: 4}
	logger := slog.New(slog.DiscardHandler)
	// Each mailer's first send waits for the other's: with FOR UPDATE but
	// no SKIP LOCKED, the second mailer's claim would wait for the first's
	// batch instead, and the first send would fail.
	runMailer(t, notify.NewMailer(db.Pool, &gatedSender{rec: rec, first: a, other: b}, cfg, logger))
	runMailer(t, notify.NewMailer(db.Pool, &gatedSender{rec: rec, first: b, other: a}, cfg, logger))
	awaitNonePending(t, db)

	sent := map[string]int{}
	for _, m := range rec.Calls() {
		sent[m.ID]++
	}
	require.Len(t, sent, n)
	for _, id := range ids {
		require.Equal(t, 1, sent[id], "%s sent once", id)
	}
	var settled, once int
	require.NoError(t, db.Pool.QueryRow(t.Context(),
		`SELECT count(*) FILTER (WHERE status = 'SENT'), count(*) FILTER (WHERE attempts = 1) FROM notifications`).Scan(&settled, &once))
	require.Equal(t, n, settled)
	require.Equal(t, n, once)
	select {
	case <-a:
	default:
		t.Fatal("the first mailer sent nothing")
	}
	select {
	case <-b:
	default:
		t.Fatal("the second mailer sent nothing")
	}
}

// failingSender fails every e-mail in fail and sends the others, and counts
// the calls per Message-ID.
type failingSender struct {
	fail  map[string]bool
	panic bool // panic with the error instead of returning it

	mu    sync.Mutex
	calls map[string]int
}

func (s *failingSender) Send(_ context.Context, m notify.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[m.ID]++
	if s.fail[m.ID] {
		err := fmt.Errorf("550 no such user (call %d)", s.calls[m.ID])
		if s.panic {
			panic(err)
		}
		return err
	}
	return nil
}

// A sender that panics fails its e-mail's attempt, as one that returned the
// error would; the mailer carries on.
func TestMailerBatchFailsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%t", panics), func(t *testing.T) {
			t.Parallel()
			mailerBatchFailsAfterMaxAttempts(t, panics)
		})
	}
}

func mailerBatchFailsAfterMaxAttempts(t *testing.T, panics bool) {
	const n = 40
	db, ids := newMailerDB(t, n)
	sender := &failingSender{fail: map[string]bool{}, calls: map[string]int{}, panic: panics}
	for i, id := range ids {
		if i%3 == 0 {
			sender.fail[id] = true
		}
	}
	m := notify.NewMailer(db.Pool, sender, notify.MailerConfig{
		PollInterval: 5 * time.Millisecond,
		MaxAttempts:  3,
		RetryBackoff: time.Millisecond,
		BatchSize:    8,
		Concurrency:  3,
	}, slog.New(slog.DiscardHandler))
	runMailer(t, m)
	awaitNonePending(t, db)

	r, err := db.Pool.Query(t.Context(), `SELECT message_id, status, attempts, last_error, sent_at IS NOT NULL FROM notifications`)
	require.NoError(t, err)
	type outcome struct {
		id, status, lastError string
		attempts              int
		sent                  bool
	}
	got, err := pgx.CollectRows(r, func(row pgx.CollectableRow) (outcome, error) {
		var o outcome
		err := row.Scan(&o.id, &o.status, &o.attempts, &o.lastError, &o.sent)
		return o, err
	})
	require.NoError(t, err)
	require.Len(t, got, n)
	sender.mu.Lock()
	defer sender.mu.Unlock()
	for _, o := range got {
		if sender.fail[o.id] {
			want := "550 no such user (call 3)"
			if panics {
				want = "panic: " + want
			}
			require.Equal(t, outcome{id: o.id, status: notify.StatusFailed, attempts: 3, lastError: want}, o)
			require.Equal(t, 3, sender.calls[o.id], "tried MaxAttempts times, then left alone")
			continue
		}
		require.Equal(t, outcome{id: o.id, status: notify.StatusSent, attempts: 1, sent: true}, o)
		require.Equal(t, 1, sender.calls[o.id])
	}
}

// holdingSender holds every Send until released and tracks how many are in
// flight at once.
type holdingSender struct {
	release chan struct{}

	mu             sync.Mutex
	inFlight, most int
	calls          int
}

func (s *holdingSender) Send(ctx context.Context, _ notify.Message) error {
	s.mu.Lock()
	s.calls++
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *holdingSender) state() (inFlight, most, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight, s.most, s.calls
}

func TestMailerRespectsBatchSizeAndConcurrency(t *testing.T) {
	t.Parallel()
	const n = 10
	db, _ := newMailerDB(t, n)
	sender := &holdingSender{release: make(chan struct{})}
	m := notify.NewMailer(db.Pool, sender, notify.MailerConfig{BatchSize: 4, Concurrency: 2}, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	var tried int
	go func() {
		var err error
		tried, err = m.SendDue(t.Context())
		done <- err
	}()

	require.Eventually(t, func() bool {
		inFlight, _, _ := sender.state()
		return inFlight == 2
	}, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // room for a third send, were one allowed
	inFlight, most, calls := sender.state()
	require.Equal(t, 2, inFlight, "Concurrency sends at once")
	require.Equal(t, 2, most)
	require.Equal(t, 2, calls)
	// The batch holds its rows; another mailer would find only the rest.
	var free int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `
		SELECT count(*) FROM (SELECT id FROM notifications WHERE status = 'PENDING' FOR UPDATE SKIP LOCKED) AS f`).Scan(&free))
	require.Equal(t, n-4, free, "one batch claims BatchSize rows")

	close(sender.release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("SendDue did not return")
	}
	require.Equal(t, n, tried)
	_, most, calls = sender.state()
	require.Equal(t, 2, most)
	require.Equal(t, n, calls)
	var sent int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM notifications WHERE status = 'SENT' AND attempts = 1`).Scan(&sent))
	require.Equal(t, n, sent)
}

// The compose demo's dashboard shows the mailer's metrics.
func TestDashboardShowsTheMailer(t *testing.T) {
	t.Parallel()
	m := notify.NewMailer(nil, nil, notify.MailerConfig{}, slog.New(slog.DiscardHandler))
	apptest.RequireDashboardShows(t, "onceflow_mailer_", m.Collector())
}

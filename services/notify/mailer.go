package notify

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/services/notify/internal/dbsqlc"
)

// Mailer defaults; see MailerConfig.
const (
	DefaultMailFrom     = "onceflow <noreply@onceflow.example>"
	defaultPollInterval = 500 * time.Millisecond
	defaultMaxAttempts  = 8
	defaultRetryBackoff = 10 * time.Second
	defaultSendTimeout  = 30 * time.Second
	defaultBatchSize    = 64
	defaultConcurrency  = 8
	maxRetryBackoff     = time.Hour
	// dbTimeout bounds the claim, and the marks and commit, of one batch.
	dbTimeout = 10 * time.Second
	// scrapeTimeout bounds the backlog query of a metrics scrape.
	scrapeTimeout = 2 * time.Second
	// maxErrorLength bounds the last_error kept per notification.
	maxErrorLength = 1000
)

// Message is one e-mail, as a Sender gets it.
type Message struct {
	// ID is the Message-ID header, angle brackets included:
	// "<event-id@onceflow>". It is the same on every resend.
	ID      string
	To      string // a bare address
	Subject string
	Body    string // plain text, lines separated by "\n"
	// Date is when the e-mail was written, so a resend is identical.
	Date time.Time
}

// Sender hands e-mails to whatever delivers them. Send may be called again
// with a message it already delivered (after a crash); the Message-ID lets
// the receiver recognise it. A Mailer calls Send from several goroutines at
// once (MailerConfig.Concurrency).
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// MailerConfig configures a Mailer. Zero values take the defaults.
type MailerConfig struct {
	// PollInterval is the pause between two looks at the notifications
	// table. Default 500ms.
	PollInterval time.Duration
	// MaxAttempts is how often an e-mail is tried before it is FAILED.
	// Default 8.
	MaxAttempts int
	// RetryBackoff is the wait after a first failed attempt; it doubles
	// with each further failure, up to an hour. Default 10s, which with the
	// default MaxAttempts rides out about 20 minutes of mail server outage.
	RetryBackoff time.Duration
	// SendTimeout bounds one Send. Default 30s.
	SendTimeout time.Duration
	// BatchSize is how many due e-mails the mailer claims, sends and marks
	// in one transaction. Default 64. It also bounds what a crash can make
	// the mailer send twice.
	BatchSize int
	// Concurrency is how many e-mails of a batch are sent at once: each
	// send is a network round trip or several, mostly waiting. Default 8.
	Concurrency int
}

// Mailer sends the notifications table, the notify service's mail outbox.
//
// It claims a batch of the oldest due PENDING rows with FOR UPDATE SKIP
// LOCKED, sends them with bounded concurrency, and in the same transaction
// marks the sent ones SENT and records the failed attempts and their errors
// — to be tried again after a backoff, and FAILED after MaxAttempts — with
// one statement each. Several mailers (replicas of the service) can run on
// one database: each skips the rows another holds, so no row is sent by two
// of them.
//
// Delivery to the mail server is at least once: a crash after the server
// accepted an e-mail and before SENT was committed sends it again, with the
// same Message-ID. One transaction per batch bounds this to the batch in
// hand (BatchSize e-mails); BatchSize 1 bounds it to one e-mail at the cost
// of throughput.
type Mailer struct {
	pool    *pgxpool.Pool
	sender  Sender
	cfg     MailerConfig
	logger  *slog.Logger
	queries *dbsqlc.Queries

	sent, retried, failed atomic.Int64
}

// NewMailer returns a mailer of the notifications in pool's database that
// sends through sender. Start it with Run.
func NewMailer(pool *pgxpool.Pool, sender Sender, cfg MailerConfig, logger *slog.Logger) *Mailer {
	cfg.PollInterval = cmp.Or(max(cfg.PollInterval, 0), defaultPollInterval)
	cfg.MaxAttempts = cmp.Or(max(cfg.MaxAttempts, 0), defaultMaxAttempts)
	cfg.RetryBackoff = cmp.Or(max(cfg.RetryBackoff, 0), defaultRetryBackoff)
	cfg.SendTimeout = cmp.Or(max(cfg.SendTimeout, 0), defaultSendTimeout)
	cfg.BatchSize = cmp.Or(max(cfg.BatchSize, 0), defaultBatchSize)
	cfg.Concurrency = cmp.Or(max(cfg.Concurrency, 0), defaultConcurrency)
	return &Mailer{
		pool:    pool,
		sender:  sender,
		cfg:     cfg,
		logger:  logger.With("component", "mailer"),
		queries: dbsqlc.New(),
	}
}

// Run sends due notifications at once and then every PollInterval until ctx
// is done, and returns nil then. On shutdown it finishes the e-mails being
// sent, so that those the mail server accepted are also marked SENT, and
// leaves the rest of the batch PENDING, untried. A failure of the database
// is logged and tried again at the next interval.
//
// Run works in the calling goroutine; it starts goroutines only for the
// sends of a batch, and waits for them.
func (m *Mailer) Run(ctx context.Context) error {
	ticker := time.NewTicker(m.cfg.PollInterval)
	defer ticker.Stop()
	for {
		_, err := m.SendDue(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.logger.WarnContext(ctx, "send notifications", "error", err, "retry_in", m.cfg.PollInterval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// SendDue sends every notification that is due when it is called, a batch
// at a time in id order, and returns how many it tried (sent or not). It
// returns early, with ctx's error, when ctx is done; the e-mails being sent
// are finished first.
func (m *Mailer) SendDue(ctx context.Context) (int, error) {
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		claimed, tried, err := m.sendBatch(ctx)
		n += tried
		// A short batch means no other row was due and unclaimed; rows due
		// since are the next poll's.
		if err != nil || claimed < m.cfg.BatchSize {
			return n, err
		}
	}
}

// sendBatch claims up to BatchSize due notifications, sends them and records
// the outcomes, in one transaction. It returns how many it claimed and how
// many of those it tried: on shutdown, those not yet started are left
// untouched.
func (m *Mailer) sendBatch(ctx context.Context) (claimed, tried int, err error) {
	// The e-mails in hand are finished even when ctx is canceled: the server
	// may have accepted them, and then they should be marked SENT. The
	// timeouts keep a hung server or database from holding up shutdown for
	// ever.
	work := context.WithoutCancel(ctx)
	claimCtx, cancelClaim := context.WithTimeout(work, dbTimeout)
	defer cancelClaim()
	tx, err := m.pool.Begin(claimCtx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin: %w", err)
	}
	// After Commit this is a no-op; after a failure the rollback leaves the
	// rows PENDING, to be sent again.
	defer func() {
		rbCtx, cancel := context.WithTimeout(work, dbTimeout)
		defer cancel()
		_ = tx.Rollback(rbCtx)
	}()

	ns, err := m.queries.ClaimDueNotifications(claimCtx, tx, int32(min(m.cfg.BatchSize, 1<<31-1)))
	if err != nil {
		return 0, 0, fmt.Errorf("claim notifications: %w", err)
	}
	if len(ns) == 0 {
		return 0, 0, nil
	}

	results := m.sendAll(ctx, ns)

	sent, failed, tried := m.outcomes(ns, results)

	markCtx, cancelMark := context.WithTimeout(work, dbTimeout)
	defer cancelMark()
	if len(sent) > 0 {
		if err := m.queries.MarkNotificationsSent(markCtx, tx, sent); err != nil {
			return len(ns), tried, fmt.Errorf("mark %d notifications sent: %w", len(sent), err)
		}
	}
	status := make(map[int64]string, len(failed.Ids))
	if len(failed.Ids) > 0 {
		rows, err := m.queries.MarkNotificationAttemptsFailed(markCtx, tx, failed)
		if err != nil {
			return len(ns), tried, fmt.Errorf("record %d failed attempts: %w", len(failed.Ids), err)
		}
		for _, r := range rows {
			status[r.ID] = r.Status
		}
	}
	if err := tx.Commit(markCtx); err != nil {
		return len(ns), tried, fmt.Errorf("commit %d notifications: %w", len(ns), err)
	}

	m.report(ctx, ns, results, status)
	return len(ns), tried, nil
}

// outcomes sorts the claimed notifications ns by their results: the ids of
// those sent, the failed attempts to record, and how many were tried.
func (m *Mailer) outcomes(ns []dbsqlc.ClaimDueNotificationsRow, results []sendResult) (sent []int64, failed dbsqlc.MarkNotificationAttemptsFailedParams, tried int) {
	failed.MaxAttempts = int32(min(m.cfg.MaxAttempts, 1<<31-1))
	for i, n := range ns {
		r := results[i]
		if r.tried {
			tried++
		}
		switch {
		case !r.tried:
		case r.err == nil:
			sent = append(sent, n.ID)
		default:
			failed.Ids = append(failed.Ids, n.ID)
			failed.LastErrors = append(failed.LastErrors, truncate(r.err.Error(), maxErrorLength))
			failed.RetryAfters = append(failed.RetryAfters,
				pgtype.Interval{Microseconds: m.backoff(n.Attempts + 1).Microseconds(), Valid: true})
		}
	}
	return sent, failed, tried
}

// report counts and logs the outcomes of a committed batch; status holds
// the status each failed attempt left its notification in.
func (m *Mailer) report(ctx context.Context, ns []dbsqlc.ClaimDueNotificationsRow, results []sendResult, status map[int64]string) {
	for i, n := range ns {
		r := results[i]
		switch {
		case !r.tried:
			continue
		case r.err == nil:
			m.sent.Add(1)
			m.logger.DebugContext(ctx, "e-mail sent", "message_id", n.MessageID)
		case status[n.ID] == StatusFailed:
			m.failed.Add(1)
			m.logger.ErrorContext(ctx, "e-mail failed for good", "message_id", n.MessageID, "attempts", n.Attempts+1, "error", r.err)
		default:
			m.retried.Add(1)
			m.logger.WarnContext(ctx, "e-mail not sent; will retry", "message_id", n.MessageID, "attempt", n.Attempts+1, "error", r.err)
		}
	}
}

// sendResult is the outcome of one claimed e-mail of a batch.
type sendResult struct {
	tried bool // false: not started because ctx was done
	err   error
}

// sendAll sends ns, at most Concurrency at once, and returns their results
// in the same order. Once ctx is done it starts no further send; those
// started are finished under a context that is not canceled.
func (m *Mailer) sendAll(ctx context.Context, ns []dbsqlc.ClaimDueNotificationsRow) []sendResult {
	results := make([]sendResult, len(ns))
	work := context.WithoutCancel(ctx)
	var g errgroup.Group
	g.SetLimit(m.cfg.Concurrency)
	for i, n := range ns {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			// Go may have waited for a free slot past the cancellation.
			if ctx.Err() != nil {
				return nil
			}
			sendCtx, cancel := context.WithTimeout(work, m.cfg.SendTimeout)
			defer cancel()
			// A panic is the attempt's failure; the mailer carries on.
			err := panics.Recover(func() error {
				return m.sender.Send(sendCtx, Message{ID: n.MessageID, To: n.Recipient, Subject: n.Subject, Body: n.Body, Date: n.CreatedAt})
			})
			if stack := panics.Stack(err); stack != nil {
				m.logger.ErrorContext(ctx, "e-mail sender panicked", "message_id", n.MessageID, "error", err, "stack", string(stack))
			}
			results[i] = sendResult{tried: true, err: err}
			return nil
		})
	}
	_ = g.Wait() // the sends report through results
	return results
}

// backoff is the wait after the attempt-th failed attempt: RetryBackoff,
// doubled per further attempt, at most an hour.
func (m *Mailer) backoff(attempt int32) time.Duration {
	d := m.cfg.RetryBackoff
	for i := int32(1); i < attempt && d < maxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, maxRetryBackoff)
}

// truncate cuts s to at most n bytes, dropping a rune cut in half:
// PostgreSQL refuses invalid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// mailerCollector exports the mailer's counters and backlog at scrape time.
type mailerCollector struct {
	m *Mailer

	sends     *prometheus.Desc
	pending   *prometheus.Desc
	oldestAge *prometheus.Desc
}

// Collector returns the mailer's metrics.
func (m *Mailer) Collector() prometheus.Collector {
	return &mailerCollector{
		m: m,
		sends: prometheus.NewDesc("onceflow_mailer_sends_total",
			"E-mails tried by the mailer, by outcome: sent, retried (failed, to be tried again) or failed (for good).",
			[]string{"outcome"}, nil),
		pending: prometheus.NewDesc("onceflow_mailer_pending",
			"Notifications not yet sent or failed.", nil, nil),
		oldestAge: prometheus.NewDesc("onceflow_mailer_oldest_pending_age_seconds",
			"Age of the oldest pending notification.", nil, nil),
	}
}

func (c *mailerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sends
	ch <- c.pending
	ch <- c.oldestAge
}

func (c *mailerCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.sends, prometheus.CounterValue, float64(c.m.sent.Load()), "sent")
	ch <- prometheus.MustNewConstMetric(c.sends, prometheus.CounterValue, float64(c.m.retried.Load()), "retried")
	ch <- prometheus.MustNewConstMetric(c.sends, prometheus.CounterValue, float64(c.m.failed.Load()), "failed")
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	lag, err := c.m.queries.MailerLag(ctx, c.m.pool)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.pending, fmt.Errorf("mailer lag: %w", err))
		return
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(lag.Pending))
	ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, max(lag.Now.Sub(lag.OldestCreatedAt), 0).Seconds())
}

// SMTPSender sends e-mails over plain SMTP, without TLS or authentication:
// to a relay on a trusted network or a catcher like Mailpit, which takes it
// from there.
type SMTPSender struct {
	addr string
	host string
	from *mail.Address
}

// NewSMTPSender returns a sender to the SMTP server at addr (host:port)
// with the From address from, e.g. "onceflow <noreply@onceflow.example>".
func NewSMTPSender(addr, from string) (*SMTPSender, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("smtp address %q: %w", addr, err)
	}
	f, err := mail.ParseAddress(from)
	if err != nil {
		return nil, fmt.Errorf("mail from %q: %w", from, err)
	}
	return &SMTPSender{addr: addr, host: host, from: f}, nil
}

// Send delivers m to the SMTP server. It returns nil once the server has
// accepted the message data.
func (s *SMTPSender) Send(ctx context.Context, m Message) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("dial smtp server: %w", err)
	}
	defer conn.Close()
	// net/smtp knows no context: a deadline, and an expired one on cancel,
	// bound every exchange instead.
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return fmt.Errorf("smtp deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return fmt.Errorf("smtp greeting: %w", err)
	}
	defer c.Close()
	if err := c.Mail(s.from.Address); err != nil {
		return fmt.Errorf("smtp MAIL FROM: %w", err)
	}
	if err := c.Rcpt(m.To); err != nil {
		return fmt.Errorf("smtp RCPT TO %s: %w", m.To, err)
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	if _, err := w.Write(s.format(m)); err != nil {
		return fmt.Errorf("smtp message: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("smtp end of message: %w", err)
	}
	// The server has accepted the message: a failed QUIT must not make the
	// mailer send it again.
	_ = c.Quit()
	return nil
}

// format is m as an RFC 5322 message: headers and a quoted-printable
// plain-text body.
func (s *SMTPSender) format(m Message) []byte {
	var b bytes.Buffer
	header := func(name, value string) { fmt.Fprintf(&b, "%s: %s\r\n", name, value) }
	header("From", s.from.String())
	header("To", (&mail.Address{Address: m.To}).String())
	// Q-encoding also turns any CR or LF into an encoded word, so a subject
	// cannot add headers.
	header("Subject", mime.QEncoding.Encode("utf-8", m.Subject))
	header("Date", m.Date.Format(time.RFC1123Z))
	header("Message-ID", m.ID)
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	qp := quotedprintable.NewWriter(&b)
	_, _ = qp.Write([]byte(m.Body)) // writes to a bytes.Buffer cannot fail
	_ = qp.Close()
	return b.Bytes()
}

// LogSender logs e-mails instead of sending them: the sender when no SMTP
// server is configured.
type LogSender struct {
	logger *slog.Logger
}

// NewLogSender returns a sender that logs to logger.
func NewLogSender(logger *slog.Logger) *LogSender {
	return &LogSender{logger: logger}
}

// Send logs m and returns nil.
func (s *LogSender) Send(ctx context.Context, m Message) error {
	s.logger.InfoContext(ctx, "e-mail", "message_id", m.ID, "to", m.To, "subject", m.Subject, "body", m.Body)
	return nil
}

package cli

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/services/notify"
)

// sentMail records the Message-IDs it is asked to send.
type sentMail struct {
	mu  sync.Mutex
	ids []string
}

func (s *sentMail) Send(_ context.Context, m notify.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, m.ID)
	return nil
}

func (s *sentMail) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// TestMailRetry: three e-mails the mailer gave up on; the command retries
// the one its filters select, and the mailer sends that one once, under its
// Message-ID. The others stay FAILED.
func TestMailRetry(t *testing.T) {
	db := testenv.NewServiceDatabase(t, notify.Name)
	t.Setenv("NOTIFY_DATABASE_URL", db.URL)
	order, other := uuid.New(), uuid.New()
	failed := func(order uuid.UUID, kind, messageID string, age time.Duration) {
		_, err := db.Pool.Exec(t.Context(), `
			INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body, status, attempts, last_error, created_at)
			VALUES ($1, $2, 'alice@example.com', gen_random_uuid(), $3, 's', 'b', 'FAILED', 8, 'smtp: 421 try later', now() - $4::interval)`,
			order, kind, messageID, age)
		require.NoError(t, err)
	}
	failed(order, "placed", "<placed@onceflow>", 2*time.Hour)
	failed(order, "confirmed", "<confirmed@onceflow>", time.Minute)
	failed(other, "placed", "<other@onceflow>", time.Minute)

	stdout, _, err := run(t, "mail", "retry", "--order", order.String(), "--since", "1h")
	require.NoError(t, err)
	require.Equal(t, "1 failed e-mails set to be sent again; the notify service's mailer sends them.\n", stdout)

	sender := &sentMail{}
	mailer := notify.NewMailer(db.Pool, sender, notify.MailerConfig{PollInterval: 5 * time.Millisecond, MaxAttempts: 8}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mailer.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	status := func(messageID string) (status string, attempts int) {
		require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT status, attempts FROM notifications WHERE message_id = $1`, messageID).Scan(&status, &attempts))
		return status, attempts
	}
	require.Eventually(t, func() bool {
		s, _ := status("<confirmed@onceflow>")
		return s == notify.StatusSent
	}, 30*time.Second, 10*time.Millisecond)
	_, attempts := status("<confirmed@onceflow>")
	require.Equal(t, 1, attempts, "its attempts start again")

	// Without --since, the order's older e-mail is retried too.
	stdout, _, err = run(t, "mail", "retry", "--order", order.String())
	require.NoError(t, err)
	require.Equal(t, "1 failed e-mails set to be sent again; the notify service's mailer sends them.\n", stdout)
	require.Eventually(t, func() bool {
		s, _ := status("<placed@onceflow>")
		return s == notify.StatusSent
	}, 30*time.Second, 10*time.Millisecond)
	require.ElementsMatch(t, []string{"<confirmed@onceflow>", "<placed@onceflow>"}, sender.sent(), "each sent once, under its Message-ID")
	s, attempts := status("<other@onceflow>")
	require.Equal(t, notify.StatusFailed, s, "another order's e-mail stays FAILED")
	require.Equal(t, 8, attempts)

	stdout, _, err = run(t, "mail", "retry")
	require.NoError(t, err)
	require.Equal(t, "1 failed e-mails set to be sent again; the notify service's mailer sends them.\n", stdout)
}

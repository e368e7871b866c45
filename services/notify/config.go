package notify

import (
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/app"
)

// Config is the notify service's configuration, read from the environment.
// A zero value of a mailer setting takes its default, so a Config built in
// code needs only app.Config.
type Config struct {
	app.Config

	// SMTPAddr is the host:port of the SMTP server the mailer sends to. When
	// empty, e-mails are logged instead of sent.
	SMTPAddr string `env:"SMTP_ADDR"`
	// MailFrom is the From address of every e-mail.
	MailFrom string `env:"MAIL_FROM" envDefault:"onceflow <noreply@onceflow.example>"`
	// MailerPollInterval is how often the mailer looks for e-mails to send.
	MailerPollInterval time.Duration `env:"MAILER_POLL_INTERVAL" envDefault:"500ms"`
	// MailerMaxAttempts is how often an e-mail is tried before it is FAILED.
	MailerMaxAttempts int `env:"MAILER_MAX_ATTEMPTS" envDefault:"8"`
	// MailerRetryBackoff is the wait after a first failed attempt, doubled
	// after each further one (at most an hour).
	MailerRetryBackoff time.Duration `env:"MAILER_RETRY_BACKOFF" envDefault:"10s"`
	// MailerBatchSize is how many e-mails the mailer claims, sends and marks
	// in one transaction; a crash can send the batch in hand twice.
	MailerBatchSize int `env:"MAILER_BATCH_SIZE" envDefault:"64"`
	// MailerConcurrency is how many e-mails of a batch are sent at once.
	MailerConcurrency int `env:"MAILER_CONCURRENCY" envDefault:"8"`

	// Sender, when set (by tests), replaces the SMTP or log sender.
	Sender Sender `env:"-"`
}

// LoadConfig reads Config from the environment.
func LoadConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("notify config: %w", err)
	}
	return cfg, nil
}

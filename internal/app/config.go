package app

import (
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/natsauth"
)

// Config is what every service reads from its environment. Services embed it
// in their own Config and parse both with github.com/caarlos0/env.
type Config struct {
	DatabaseURL string `env:"DATABASE_URL,required"`
	// DatabaseMaxConns bounds the service's connections to its database,
	// unless DATABASE_URL sets pool_max_conns.
	DatabaseMaxConns int32 `env:"DATABASE_MAX_CONNS" envDefault:"16"`
	// DatabaseStatementTimeout is every statement's statement_timeout;
	// DatabaseAcquireTimeout how long an HTTP request waits for one of the
	// DatabaseMaxConns connections. Past either, the request is answered
	// 503 with Retry-After (and a consumer's batch is retried later).
	DatabaseStatementTimeout time.Duration `env:"DATABASE_STATEMENT_TIMEOUT" envDefault:"10s"`
	DatabaseAcquireTimeout   time.Duration `env:"DATABASE_ACQUIRE_TIMEOUT" envDefault:"2s"`
	// NATSURL is one server's URL or a comma-separated list of a
	// cluster's; the client connects to one of them and fails over to the
	// others.
	NATSURL  string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`

	// NATSCreds is the service's credentials file (natsauth); NATSTLSCA
	// the CAs of a tls:// NATS_URL's server, when not the system's. The
	// streams' and durables' settings are `onceflow provision`'s
	// (streams.Config).
	NATSCreds string `env:"NATS_CREDS"`
	NATSTLSCA string `env:"NATS_TLS_CA"`

	// Inbox consumers: the most messages in a batch, batches processed at
	// once per subscription.
	ConsumerBatchSize int           `env:"CONSUMER_BATCH_SIZE" envDefault:"64"`
	ConsumerWorkers   int           `env:"CONSUMER_WORKERS" envDefault:"1"`
	InboxRetention    time.Duration `env:"INBOX_RETENTION" envDefault:"168h"`
	// The inbox is partitioned by the events' time, in partitions of
	// InboxPartitionInterval, dropped past the retention and made
	// InboxMaxSkew (and two intervals) ahead of the clock, so that the
	// events of a producer whose clock is that fast have their partition
	// (one further ahead is processed too, its claim waiting in the
	// DEFAULT partition until its own is made; docs/operating.md sizes
	// them).
	InboxPartitionInterval time.Duration `env:"INBOX_PARTITION_INTERVAL" envDefault:"1h"`
	InboxMaxSkew           time.Duration `env:"INBOX_MAX_SKEW" envDefault:"5m"`

	// ConsumerBatched, when set, overrides every subscription's choice of
	// path (Subscription.Batched): true, a batch per transaction; false,
	// one message per transaction (the reference path).
	ConsumerBatched *bool `env:"CONSUMER_BATCHED"`
	// ConsumerSetBased false drops the subscriptions' set-based batch
	// handlers: every event of a batch runs its own handler in turn.
	ConsumerSetBased bool `env:"CONSUMER_SET_BASED" envDefault:"true"`

	OutboxBatchSize    int           `env:"OUTBOX_BATCH_SIZE" envDefault:"1024"`
	OutboxPollInterval time.Duration `env:"OUTBOX_POLL_INTERVAL" envDefault:"1s"`
	// Batches of at least this many outbox rows are published as JetStream
	// atomic batches, one fsync each under sync_interval: always; 0 never.
	OutboxAtomicBatchMin int `env:"OUTBOX_ATOMIC_BATCH_MIN" envDefault:"32"`
	// Sent outbox rows are kept this long for `outbox redrive`; it must be at
	// least the stream duplicate window.
	OutboxRetention time.Duration `env:"OUTBOX_RETENTION" envDefault:"1h"`
	// The outbox is partitioned by the time its rows were written, in
	// partitions of this width.
	OutboxPartitionInterval time.Duration `env:"OUTBOX_PARTITION_INTERVAL" envDefault:"1h"`

	IdempotencyRetention time.Duration `env:"IDEMPOTENCY_RETENTION" envDefault:"24h"`

	// ShutdownTimeout bounds each step of a stop: the HTTP server's grace
	// for requests in flight (then it closes the connections left) and the
	// final outbox flush.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`

	// FaultKillAfterCommit is for the end-to-end fault suite only: the
	// probability (0..1) that the process SIGKILLs itself right after an inbox
	// transaction commits and before the message is acked.
	FaultKillAfterCommit float64 `env:"ONCEFLOW_FAULT_KILL_AFTER_COMMIT"`

	// Auth is where the bearer tokens of the HTTP API come from (AUTH_*).
	Auth auth.Config

	// Tracing is off unless the standard OTEL_* variables name an exporter.
	Tracing TracingConfig
	// TracerProvider, when set (by tests), traces the service instead of
	// the provider Tracing describes; Run does not shut it down.
	TracerProvider trace.TracerProvider `env:"-"`

	// HTTPListener, when set (by tests and `onceflow dev`), is served instead
	// of listening on HTTPAddr.
	HTTPListener net.Listener `env:"-"`
}

// natsClient is how the service connects to NATS.
func (c Config) natsClient() natsauth.Client {
	return natsauth.Client{URL: c.NATSURL, Creds: c.NATSCreds, TLSCA: c.NATSTLSCA}
}

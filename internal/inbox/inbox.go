package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/jsbatch"
	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// DefaultRetention is how long processed_events rows are kept by default,
// counted from the time the event's id was minted. It must exceed the
// longest time after which an event can still be delivered: its wait in the
// producer's outbox, the stream's max age (72h by default) and the
// consumer's lag.
const DefaultRetention = 7 * 24 * time.Hour

const (
	defaultBatchSize = 64
	defaultWorkers   = 1
	defaultNakDelay  = time.Second

	// flushTimeout bounds the wait for the server to receive the last acks
	// when Run stops.
	flushTimeout = 5 * time.Second
)

// ErrPermanent is wrapped by errors that no retry can fix. A message whose
// handler returns one is dead-lettered at once.
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as permanent: the message is copied to the DLQ and
// terminated instead of being retried. Errors wrapping event.ErrInvalid are
// permanent without it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

func isPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, event.ErrInvalid) || refusedClaim(err)
}

// Handler applies one event's effect. It runs inside the inbox
// transaction, after the claim of the event, and writes through tx only: a
// plain pgx.Tx, whose statements answer where they are called (a unique
// violation comes back from the insert that caused it). It never commits
// or rolls back tx itself. An error rolls back the transaction and the
// message is retried; wrap it with Permanent if a retry cannot succeed. In
// batched mode, when another event of the batch fails, a handler that
// succeeded sees its writes rolled back and is called again for the same
// event in a transaction of its own.
type Handler func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error

// BatchHandler is the optional set-based form of a Handler, the last
// optimisation to read: it applies the effects of all the new events of a
// batch at once (e.g. one UPDATE … FROM unnest(…) instead of one UPDATE per
// event), inside the inbox transaction, after their claim. It receives them
// in delivery order and must leave the database exactly as the Handler
// would, called for each event in that order, and must lock the rows it
// updates in key order, so that two batches cannot deadlock.
//
// It reads through tx, whose statements PostgreSQL plans for their
// arguments each time (the PlanEachCall query): a batch's arrays would
// defeat a cached generic plan. The writes that need no answer (the batch's
// updates, inserts and outbox rows) it queues on writes, an explicit
// pipeline: the inbox sends them with the COMMIT, in one round trip, and
// runs them with their generic plans, made once per connection. An update
// joined to arrays must then name its keys with = ANY as well as joining on
// them: a join alone, planned while the table was nearly empty, scans the
// whole table at every call until the table is analyzed (see
// SetOrderStatuses in db/queries/order and db/plans_test.go). An error,
// returned or of a queued write, rolls back the transaction, and each event
// of the batch is processed again with the Handler, in a transaction of its
// own, so that one bad event fails only itself.
type BatchHandler func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, writes *postgres.Pipeline) error

// Config configures a Consumer. Zero values take the defaults.
type Config struct {
	// Stream and Durable name an existing durable pull consumer with explicit
	// acks, as streams.Provision creates them. Durable is also the inbox's
	// consumer key in processed_events and the DLQ subject's last token.
	Stream  string
	Durable string
	// BatchSize is the most messages a batch holds (default 64); as many
	// more may wait in hand or be asked for while one is processed.
	BatchSize int
	// Batched names the fast path: a batch in one transaction (batch.go)
	// instead of one transaction per message (processOne, the default). It
	// is faster under load; a message that comes alone is a batch at once
	// (package jsbatch), so it costs no latency under light load.
	Batched bool
	// BatchHandler, when set, processes the new events of a batch in Batched
	// mode in one call; the Handler remains the fallback when it fails, and
	// processes every event when Batched is off.
	BatchHandler BatchHandler
	// Workers is the number of batches processed at once, each worker
	// consuming on its own (default 1).
	Workers int
	// NakDelay is how long a failed message waits before its first
	// redelivery (default 1s); it doubles with every delivery, up to a minute.
	NakDelay time.Duration
	// Retention must be the partition maintenance's inbox retention
	// (default DefaultRetention; partition.InboxTable). An event minted
	// (or timed) earlier than that may have lost its processed_events
	// partition, so it is dead-lettered rather than processed blindly; so
	// is one dated further ahead than that, which no clock's error
	// explains (see inTime).
	Retention time.Duration
	// Observer, when set, is told of every handler call, transaction and
	// settled message (metrics, tracing); package app sets it.
	Observer Observer
	// Topology, when set, has every event checked against its owner in it
	// (owner.go), and dead-lettered when it fails; package app sets it.
	Topology *streams.Topology
}

func (cfg Config) validate() error {
	switch {
	case cfg.Stream == "" || cfg.Durable == "":
		return errors.New("stream and durable are required")
	case cfg.BatchSize < 1 || cfg.Workers < 1:
		return fmt.Errorf("batch size %d and workers %d must be positive", cfg.BatchSize, cfg.Workers)
	case cfg.NakDelay < 0 || cfg.Retention <= 0:
		return fmt.Errorf("retention %s must be positive, nak delay %s not negative", cfg.Retention, cfg.NakDelay)
	}
	return nil
}

// Stats counts what a Consumer did with the messages it received.
type Stats struct {
	Processed    int64 // handled and committed
	Duplicates   int64 // already processed (acked) or dead-lettered (terminated), without calling the handler again
	DeadLettered int64 // copied to the DLQ and terminated
	Retried      int64 // naked for a redelivery
}

// Consumer runs a Handler for every message of a durable pull consumer,
// exactly once per event in effect.
type Consumer struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	cfg     Config
	handler Handler
	logger  *slog.Logger
	queries *dbsqlc.Queries

	// maxDeliver is the durable's budget (exhausted.go), read by Run before
	// its workers start; zero means none.
	maxDeliver int

	processed    atomic.Int64
	duplicates   atomic.Int64
	deadLettered atomic.Int64
	retried      atomic.Int64

	// skipSettle is a test hook (export_test.go), set before Run: when it
	// returns true for a message about to be settled with an outcome, the
	// message is left unsettled, as a crash before its settling would.
	skipSettle func(event.Envelope, Outcome) bool
	// fromMsg reads a message's envelope: event.FromMsg, replaced by a test
	// (export_test.go) to make the decoder panic.
	fromMsg func(nats.Header, []byte) (event.Envelope, error)
}

// New returns a Consumer of cfg.Durable that runs h for each event.
func New(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, h Handler, logger *slog.Logger) *Consumer {
	cfg.BatchSize = cmp.Or(cfg.BatchSize, defaultBatchSize)
	cfg.Workers = cmp.Or(cfg.Workers, defaultWorkers)
	cfg.NakDelay = cmp.Or(cfg.NakDelay, defaultNakDelay)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Consumer{
		pool:    pool,
		js:      js,
		cfg:     cfg,
		handler: h,
		logger:  logger.With("stream", cfg.Stream, "consumer", cfg.Durable),
		queries: dbsqlc.New(),
		fromMsg: event.FromMsg,
	}
}

// Stats returns the counters so far.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed:    c.processed.Load(),
		Duplicates:   c.duplicates.Load(),
		DeadLettered: c.deadLettered.Load(),
		Retried:      c.retried.Load(),
	}
}

// Run consumes and processes messages until ctx is done. It fails at once
// if the durable consumer does not exist, and later if it is deleted or the
// NATS connection closes for good. On cancellation it stops asking for
// messages, finishes those already delivered — their handlers run under a
// context that is not canceled — and returns nil. Run is called once.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.cfg.validate(); err != nil {
		return fmt.Errorf("inbox config: %w", err)
	}
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
	if ctx.Err() != nil {
		return nil // stopped before it started: nothing received, nothing to finish
	}
	if err != nil {
		return fmt.Errorf("look up consumer %s on stream %s: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	if c.maxDeliver, err = budget(cons.CachedInfo().Config); err != nil {
		return fmt.Errorf("consumer %s on stream %s: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	c.logger.InfoContext(ctx, "inbox consumer running",
		"batched", c.cfg.Batched, "batch_size", c.cfg.BatchSize, "workers", c.cfg.Workers, "max_deliver", c.maxDeliver)

	g, gctx := errgroup.WithContext(ctx)
	for range c.cfg.Workers {
		g.Go(func() error { return c.consume(gctx, cons) })
	}
	err = g.Wait()

	// Acks are published without waiting for a reply; the flush makes sure
	// the server has them before the caller closes the connection.
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	if ferr := c.js.Conn().FlushWithContext(flushCtx); ferr != nil {
		c.logger.WarnContext(ctx, "flush acks on stop; unacked messages will be redelivered and dropped as duplicates", "err", ferr)
	}
	return err
}

// process processes msgs on the path the consumer was configured for.
func (c *Consumer) process(ctx context.Context, msgs []jetstream.Msg) {
	if c.cfg.Batched {
		c.processBatch(ctx, msgs)
	} else {
		c.processEach(ctx, msgs)
	}
}

// consume processes batches of the durable consumer's messages until ctx is
// done, and then the messages already on their way. It returns an error
// only when consuming ended by itself: the NATS connection closed for good,
// or the consumer deleted.
func (c *Consumer) consume(ctx context.Context, cons jetstream.Consumer) error {
	// Messages already here are processed to the end: their handlers must
	// not see the cancellation, or a graceful stop would become a crash.
	work := context.WithoutCancel(ctx)
	err := jsbatch.Consume(ctx, cons, c.cfg.BatchSize, c.logger, func(msgs []jetstream.Msg) {
		// Handlers' panics are their messages' failures (processOne); one
		// that escapes the inbox's own code leaves the rest of the batch
		// unsettled, to be redelivered after the ack wait, and the
		// consumer running.
		if err := panics.Recover(func() error { c.process(work, msgs); return nil }); err != nil {
			c.logger.ErrorContext(ctx, "inbox panicked; the batch's unsettled messages will be redelivered",
				"messages", len(msgs), "err", err, "stack", string(panics.Stack(err)))
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", c.cfg.Durable, err)
	}
	return nil
}

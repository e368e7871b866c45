package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
)

// DefaultLockKey is the advisory lock key that the relays of one database
// share unless configured otherwise: "outbox" in ASCII. It differs from the
// key of goose's migration lock, the other advisory lock on a service
// database.
const DefaultLockKey int64 = 0x6f7574626f78

const (
	defaultBatchSize      = 256
	defaultPollInterval   = time.Second
	defaultPublishTimeout = 10 * time.Second
)

// RelayConfig configures a Relay. Zero values take the defaults.
type RelayConfig struct {
	// BatchSize is the most rows one transaction claims and publishes.
	// Default 256.
	BatchSize int
	// PollInterval is how long the relay waits for a notification before it
	// looks at the outbox anyway: the fallback for a lost NOTIFY and for a
	// broken LISTEN connection, and the pause after a failed batch.
	// Default 1s.
	PollInterval time.Duration
	// PublishTimeout bounds the wait for the acks of one batch. A row whose
	// ack has not come back by then stays unsent. Default 10s.
	PublishTimeout time.Duration
	// LockKey is the advisory lock that lets one relay at a time publish a
	// database's outbox. Default DefaultLockKey.
	LockKey int64
	// Observer, when set, is told of every batch published (metrics).
	Observer RelayObserver
	// TracerProvider, when set, traces each publish as a child of the span
	// that wrote the row (see Enqueue).
	TracerProvider trace.TracerProvider
}

// Lag is how far the relay is behind its producers.
type Lag struct {
	// Unsent counts the rows not yet acknowledged by the broker.
	Unsent int64
	// OldestAge is the age of the oldest unsent row, zero when there is none.
	OldestAge time.Duration
}

// Relay publishes the outbox of one database to JetStream. Several relays
// may run on one database (replicas of a service); an advisory lock lets one
// of them publish at a time and the others stand by.
//
// The JetStream context should be created with jetstream.WithPublishAsyncTimeout
// (e.g. the PublishTimeout): the relay stops waiting for an ack after
// PublishTimeout, but only the client can forget the pending publish.
type Relay struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	cfg     RelayConfig
	logger  *slog.Logger
	queries *dbsqlc.Queries
	tracer  trace.Tracer

	// Test hooks, set in export_test.go; nil otherwise.
	//
	// afterPublish runs after every ack of a batch came back and before the
	// rows are marked sent; an error rolls the batch back, as if the relay
	// had died there.
	afterPublish func() error
	// batchDone is called after every batch with what it returned.
	batchDone func(published int, err error)
}

// NewRelay returns a relay of the outbox in pool's database that publishes
// through js. Start it with Run.
func NewRelay(pool *pgxpool.Pool, js jetstream.JetStream, cfg RelayConfig, logger *slog.Logger) *Relay {
	cfg.BatchSize = min(cmp.Or(max(cfg.BatchSize, 0), defaultBatchSize), math.MaxInt32)
	cfg.PollInterval = cmp.Or(max(cfg.PollInterval, 0), defaultPollInterval)
	cfg.PublishTimeout = cmp.Or(max(cfg.PublishTimeout, 0), defaultPublishTimeout)
	cfg.LockKey = cmp.Or(cfg.LockKey, DefaultLockKey)
	if cfg.Observer == nil {
		cfg.Observer = nopRelayObserver{}
	}
	tracer := noopTracer()
	if cfg.TracerProvider != nil {
		tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return &Relay{
		pool:    pool,
		js:      js,
		cfg:     cfg,
		logger:  logger.With("component", "outbox-relay"),
		queries: dbsqlc.New(),
		tracer:  tracer,
	}
}

// Run relays the outbox until ctx is done, then returns nil. It flushes the
// outbox whenever a producer's commit is notified and at least every
// PollInterval. On shutdown it finishes the batch in flight, so that what
// was published is also marked sent; the caller may Flush once more after
// Run returned to publish what is left.
//
// Run works in the calling goroutine and starts none of its own.
func (r *Relay) Run(ctx context.Context) error {
	l := newListener(r.pool, r.logger)
	defer l.close()
	l.connect(ctx) // before the first flush, so that no commit goes unnoticed
	for {
		_, err := r.Flush(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// Pause for a whole interval instead of trying again at the
			// next commit: a broker or database that fails is not helped
			// by a batch per commit.
			r.logger.WarnContext(ctx, "relay outbox", "error", err, "retry_in", r.cfg.PollInterval)
			l.wait(ctx, r.cfg.PollInterval, false)
			continue
		}
		l.wait(ctx, r.cfg.PollInterval, true)
	}
}

// Flush relays every row that is unsent when it is called: it publishes batch
// after batch until one is short, and returns how many rows it marked sent.
// It returns early, with ctx's error, when ctx is done; the batch in flight
// is finished first. Flush publishes nothing and returns 0 while another
// relay holds the lock: that relay is publishing the rows.
func (r *Relay) Flush(ctx context.Context) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		claimed, sent, err := r.relayBatch(ctx)
		if r.batchDone != nil {
			r.batchDone(sent, err)
		}
		total += sent
		if err != nil {
			return total, err
		}
		if claimed < r.cfg.BatchSize {
			return total, nil
		}
	}
}

// Lag reports the unsent rows and the age of the oldest, measured on the
// database clock.
func (r *Relay) Lag(ctx context.Context) (Lag, error) {
	row, err := r.queries.UnsentLag(ctx, r.pool)
	if err != nil {
		return Lag{}, fmt.Errorf("outbox lag: %w", err)
	}
	return Lag{Unsent: row.Unsent, OldestAge: max(row.Now.Sub(row.OldestCreatedAt), 0)}, nil
}

// relayBatch claims one batch of unsent rows, publishes them and marks sent
// the rows whose acks came back, in one transaction. It returns how many
// rows it claimed and how many it marked sent.
func (r *Relay) relayBatch(ctx context.Context) (claimed, sent int, err error) {
	// A batch in flight is finished even when ctx is canceled: its messages
	// may already be in the stream and should be marked sent. The deadline
	// keeps a hung database from holding up shutdown for ever.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*r.cfg.PublishTimeout)
	defer cancel()

	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin outbox batch: %w", err)
	}
	// After Commit this is a no-op; after a failure the rollback is what
	// leaves the rows unsent, and its own error changes nothing: a broken
	// connection rolls back on the server too.
	defer func() { _ = tx.Rollback(ctx) }()

	locked, err := r.queries.TryRelayLock(ctx, tx, r.cfg.LockKey)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox relay lock: %w", err)
	}
	if !locked {
		return 0, 0, nil // another relay is publishing
	}
	rows, err := r.queries.ClaimUnsent(ctx, tx, int32(r.cfg.BatchSize))
	if err != nil {
		return 0, 0, fmt.Errorf("claim outbox rows: %w", err)
	}
	if len(rows) == 0 {
		return 0, 0, nil
	}

	acked, pubErr := r.publish(ctx, rows)
	if r.afterPublish != nil && acked > 0 {
		if err := r.afterPublish(); err != nil {
			return len(rows), 0, err
		}
	}
	if acked > 0 {
		ids := make([]int64, acked)
		for i, row := range rows[:acked] {
			ids[i] = row.ID
		}
		if err := r.queries.MarkSent(ctx, tx, ids); err != nil {
			return len(rows), 0, fmt.Errorf("mark outbox rows sent: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return len(rows), 0, fmt.Errorf("commit outbox batch: %w", err)
		}
	}
	return len(rows), acked, pubErr
}

// publish publishes rows in order and waits for their acks. It returns the
// length of the prefix of rows that were all acknowledged, and the error of
// the first row that was not. Rows after that one may be in the stream, but
// they are published again with the same message id on the next batch.
func (r *Relay) publish(ctx context.Context, rows []dbsqlc.ClaimUnsentRow) (acked int, err error) {
	futures := make([]jetstream.PubAckFuture, 0, len(rows))
	spans := make([]trace.Span, 0, len(rows))
	defer func(start time.Time) { r.observePublish(start, rows, spans, acked, err) }(time.Now())
	var pubErr error
	for _, row := range rows {
		msg, err := message(row)
		if err != nil {
			pubErr = err
			break
		}
		spans = append(spans, r.startSend(ctx, row, msg))
		// No client-side retry when no stream answers: the client would
		// resend this row after the rows behind it, out of order. The next
		// batch publishes it again, in order.
		f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID.String()), jetstream.WithRetryAttempts(0))
		if err != nil {
			// Stop here: a later row of the same aggregate must not reach
			// the stream before this one.
			pubErr = fmt.Errorf("publish event %s: %w", row.EventID, err)
			break
		}
		futures = append(futures, f)
	}

	timeout := time.NewTimer(r.cfg.PublishTimeout)
	defer timeout.Stop()
	duplicates := 0
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				duplicates++
			}
		case err := <-f.Err():
			return i, fmt.Errorf("publish event %s: %w", rows[i].EventID, err)
		case <-timeout.C:
			return i, fmt.Errorf("publish event %s: no ack within %s", rows[i].EventID, r.cfg.PublishTimeout)
		case <-ctx.Done():
			return i, fmt.Errorf("publish event %s: %w", rows[i].EventID, ctx.Err())
		}
	}
	if len(futures) > 0 {
		r.logger.DebugContext(ctx, "outbox batch published", "events", len(futures), "duplicates", duplicates)
	}
	return len(futures), pubErr
}

// message is the NATS message of an outbox row. The subject is the one the
// row was written with, so that the subject an event travels on is decided
// once, at Enqueue.
func message(row dbsqlc.ClaimUnsentRow) (*nats.Msg, error) {
	env := event.Envelope{
		ID:          row.EventID,
		Type:        event.Type(row.EventType),
		Source:      row.Source,
		Subject:     row.Subject,
		Time:        row.EventTime,
		Data:        row.Data,
		TraceParent: row.Traceparent,
	}
	msg, err := env.Msg()
	if err != nil {
		// Only a binary older than the one that wrote the row can fail
		// here. The row blocks the outbox rather than being skipped, which
		// would lose it or break its aggregate's order; Lag shows it.
		return nil, fmt.Errorf("outbox row %d: %w", row.ID, err)
	}
	msg.Subject = row.NatsSubject
	return msg, nil
}

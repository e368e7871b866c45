package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/panics"
)

// DefaultLockKey is the advisory lock key that the relays of one database
// share unless configured otherwise: "outbox" in ASCII. It differs from the
// key of goose's migration lock, the other advisory lock on a service
// database.
const DefaultLockKey int64 = 0x6f7574626f78

const (
	defaultBatchSize      = 1024
	defaultPollInterval   = time.Second
	defaultPublishTimeout = 10 * time.Second
)

// RelayConfig configures a Relay. Zero values take the defaults.
type RelayConfig struct {
	// BatchSize is the most rows claimed, published and recorded sent at
	// a time; two batches are in flight at most, so twice the batch size
	// should stay below the JetStream client's limit of pending async
	// publishes (4000 by default). Default 1024.
	BatchSize int
	// Pipelined keeps two batches in flight: the claim of the next batch
	// goes to the database while the broker acknowledges this one, and
	// carries the record of the one before. False (the default) is the
	// plain loop, a batch at a time: claim, publish, await the acks,
	// record (with the next claim). Both run the same claim and record.
	Pipelined bool
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
	// AtomicBatchMin is the least rows of a batch that the relay publishes
	// as JetStream atomic batches (nats-server 2.12+, on streams with
	// AllowAtomicPublish) instead of one message at a time: with
	// sync_interval: always the server stores an atomic batch with one
	// fsync, where it syncs every message published on its own, but it
	// stages the batch first, which costs a small batch more than it saves.
	// Zero (the default) never publishes atomically.
	AtomicBatchMin int
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
	tracer  trace.Tracer // nil without a TracerProvider
	// noRetry turns off the client's retry of a publish that no stream
	// answered: the client would resend the row after the rows behind it,
	// out of order. The next flush publishes it again, in order.
	noRetry jetstream.PublishOpt

	// Test hooks, set in export_test.go; nil otherwise.
	//
	// afterPublish runs after the acks of a batch came back and before the
	// rows are marked sent; an error leaves the batch, and those behind it,
	// unmarked, as if the relay had died there.
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
	cfg.AtomicBatchMin = max(cfg.AtomicBatchMin, 0)
	if cfg.Observer == nil {
		cfg.Observer = nopRelayObserver{}
	}
	var tracer trace.Tracer // nil: the rows' trace context travels as written
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
		noRetry: jetstream.WithRetryAttempts(0),
	}
}

// Run relays the outbox until ctx is done, then returns nil. It flushes the
// outbox whenever a producer's commit is notified and at least every
// PollInterval. On shutdown it finishes the batches in flight, so that what
// was published is also marked sent; the caller may Flush once more after
// Run returned to publish what is left.
//
// Run works in the calling goroutine; each flush publishes on a goroutine of
// its own that ends with the flush.
func (r *Relay) Run(ctx context.Context) error {
	l := newListener(r.pool, r.logger)
	defer l.close()
	l.connect(ctx) // before the first flush, so that no commit goes unnoticed
	ld := &leader{r: r}
	defer ld.resign()
	// The sleep lock is taken and released in the round trips of claims: a
	// relay that wakes up for a batch releases it with its first claim and
	// takes it again with the claim that carries the batch's mark.
	s := sleeper{next: stayAwake, pause: minBusyPause}
	for {
		f := ld.flush(ctx, s.next, l.listening())
		if ctx.Err() != nil {
			return nil
		}
		r.rest(ctx, l, &s, f)
	}
}

// leader holds the relay lock for as long as Run publishes: taking and
// releasing it around every flush would cost two round trips each. It lets
// the lock go on an error (the connection may be what failed) and when Run
// returns; a standby relay takes over when its session ends.
type leader struct {
	r        *Relay
	conn     *pgxpool.Conn // whose session holds the relay lock; nil without it
	systemID int64         // the cluster's, while conn is set
}

// flushed is what one of Run's flushes did.
type flushed struct {
	sent   int
	asleep bool // the session holds the sleep lock
	locked bool // the relay held the relay lock: no other relay publishes
	err    error
}

// flush takes the relay lock unless it holds it, then flushes the outbox;
// op and rest are relay's.
func (ld *leader) flush(ctx context.Context, op sleepOp, rest bool) flushed {
	if ld.conn == nil {
		conn, systemID, err := ld.r.lead(ctx)
		if conn == nil {
			return flushed{err: err}
		}
		ld.conn, ld.systemID = conn, systemID
	}
	var sent int
	var asleep bool
	err := panics.Recover(func() (err error) {
		sent, asleep, err = ld.r.relay(ctx, ld.conn, ld.systemID, op, rest)
		return err
	})
	if stack := panics.Stack(err); stack != nil {
		// A panic fails the flush: what it did not mark stays unsent and
		// is published again; the relay carries on.
		ld.r.logger.ErrorContext(ctx, "outbox relay panicked; the batches it did not mark are published again", "err", err, "stack", string(stack))
		ld.r.cfg.Observer.Published(0, 0, err)
	}
	if err != nil && !errors.Is(err, errCommitting) {
		ld.resign() // and the sleep lock with it
	}
	return flushed{sent: sent, asleep: asleep, locked: true, err: err}
}

// resign releases the relay lock, if held.
func (ld *leader) resign() {
	if ld.conn != nil {
		ld.r.unlock(ld.conn)
		ld.conn = nil
	}
}

// Flush relays every row that is unsent when it is called: it publishes batch
// after batch until none is left, and returns how many rows it marked sent.
// It returns early, with ctx's error, when ctx is done; the batches in flight
// are finished first. Flush publishes nothing and returns 0 while another
// relay holds the lock: that relay is publishing the rows.
func (r *Relay) Flush(ctx context.Context) (int, error) {
	sent, _, err := r.flush(ctx)
	return sent, err
}

// flush is Flush that also reports whether it held the relay lock.
func (r *Relay) flush(ctx context.Context) (sent int, locked bool, err error) {
	conn, systemID, err := r.lead(ctx)
	if conn == nil {
		return 0, false, err
	}
	defer r.unlock(conn)
	sent, _, err = r.relay(ctx, conn, systemID, stayAwake, false)
	return sent, true, err
}

// lead returns a pooled connection whose session holds the relay lock, and
// the cluster's identity, or nil when another relay holds it (and err is
// nil) or on an error. The caller hands it back with unlock.
func (r *Relay) lead(ctx context.Context) (*pgxpool.Conn, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, 0, r.failed(fmt.Errorf("acquire outbox connection: %w", err))
	}
	l, err := r.queries.TryRelayLock(ctx, conn, r.cfg.LockKey)
	if err != nil {
		// Whether the lock was taken is unknown: the session must end.
		r.closeConn(conn)
		return nil, 0, r.failed(fmt.Errorf("outbox relay lock: %w", err))
	}
	if !l.Locked {
		conn.Release()
		return nil, 0, nil // another relay is publishing
	}
	if l.Changed != "" {
		if err := r.startOver(ctx, conn, l.Changed); err != nil {
			r.unlock(conn)
			return nil, 0, r.failed(err)
		}
	}
	return conn, l.SystemID, nil
}

// startOver starts the relay over from the rows, on a database whose
// recorded position is another cluster's (a restored or cloned database, a
// promoted logical replica; why says which): its transaction ids say
// nothing here, so every row kept is published again.
func (r *Relay) startOver(ctx context.Context, conn *pgxpool.Conn, why string) error {
	ctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	defer cancel()
	n, err := r.queries.StartOver(ctx, conn)
	if err != nil {
		return fmt.Errorf("outbox relay position: %s; start over: %w", why, err)
	}
	r.logger.WarnContext(ctx, "outbox relay starts over: every row kept is published again, the consumers' inbox absorbs the copies",
		"reason", why, "rows", n)
	return nil
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

// failed reports err, which cut a flush short without marking anything, to
// the test hook, and returns it.
func (r *Relay) failed(err error) error {
	if r.batchDone != nil {
		r.batchDone(0, err)
	}
	return err
}

// dbTimeout bounds each statement of a flush, so that a hung database does
// not hold up shutdown for ever.
func (r *Relay) dbTimeout() time.Duration { return 2 * r.cfg.PublishTimeout }

// unlock releases the relay lock (and the sleep lock) and hands conn back to
// the pool. A
// connection that may still hold the lock is closed instead: back in the
// pool, idle, it would keep the other relays of the database standing by.
func (r *Relay) unlock(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := r.queries.ReleaseRelayLocks(ctx, conn); err != nil {
		r.logger.Debug("release outbox relay lock; closing its connection", "error", err)
		r.closeConn(conn)
		return
	}
	conn.Release()
}

// closeConn takes conn out of the pool and closes it, which ends its
// session and every lock the session held.
func (r *Relay) closeConn(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Hijack().Close(ctx) // the server ends the session either way
}

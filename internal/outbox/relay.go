package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// DefaultLockKey is the advisory lock key that the relays of one database
// share unless configured otherwise: "outbox" in ASCII. It differs from the
// key of goose's migration lock, the other advisory lock on a service
// database.
const DefaultLockKey int64 = 0x6f7574626f78

// sleepLockKey is the advisory lock a relay holds while it sleeps, on the
// session that holds the relay lock: the outbox trigger notifies only when
// it cannot take it shared (see the platform migration that defines the
// trigger, and TakeSleepLock). "outbox_w" in ASCII.
const sleepLockKey int64 = 0x6f7574626f785f77

// The pause of a relay that found nothing to publish while commits were in
// progress doubles from the first to the last.
const (
	minBusyPause = time.Millisecond
	maxBusyPause = 16 * time.Millisecond
)

// maxAtomicBatch is the most messages nats-server takes in one atomic
// batch unless configured otherwise.
const maxAtomicBatch = 1000

const (
	defaultBatchSize      = 1024
	defaultPollInterval   = time.Second
	defaultPublishTimeout = 10 * time.Second
)

// pipelineDepth is how many batches may be published and not yet marked
// sent at a time: one that the broker is acknowledging while the database
// marks the one before it and hands out the one after.
const pipelineDepth = 2

// RelayConfig configures a Relay. Zero values take the defaults.
type RelayConfig struct {
	// BatchSize is the most rows claimed, published and marked sent at a
	// time; two batches are in flight at most, so twice the batch size
	// should stay below the JetStream client's limit of pending async
	// publishes (4000 by default). Default 1024.
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
	// lead holds the relay lock for as long as this relay publishes: taking
	// and releasing it around every flush would cost two round trips each.
	// It is let go on an error (the connection may be what failed) and when
	// Run returns; a standby relay takes over when its session ends.
	var lead *pgxpool.Conn
	defer func() {
		if lead != nil {
			r.unlock(lead)
		}
	}()
	flush := func(op sleepOp) (sent int, asleep, locked bool, err error) {
		if lead == nil {
			if lead, err = r.lead(ctx); lead == nil {
				return 0, false, false, err
			}
		}
		sent, asleep, err = r.relay(ctx, lead, op, l.listening())
		if err != nil && !errors.Is(err, errCommitting) {
			r.unlock(lead) // and the sleep lock with it
			lead = nil
		}
		return sent, asleep, true, err
	}
	// The sleep lock is taken and released in the round trips of claims: a
	// relay that wakes up for a batch releases it with its first claim and
	// takes it again with the claim that carries the batch's mark.
	op := stayAwake
	pause := minBusyPause
	for {
		sent, asleep, locked, err := flush(op)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errCommitting):
			// Producers are committing and will not notify: look again
			// shortly, later each time in a row this happens without
			// anything to publish (a long transaction must not make the
			// relay spin).
			if sent > 0 {
				pause = minBusyPause
			}
			l.wait(ctx, pause, true)
			pause = min(2*pause, maxBusyPause, r.cfg.PollInterval)
			op = goToSleep
		case err != nil:
			// Pause for a whole interval instead of trying again at the
			// next commit: a broker or database that fails is not helped
			// by a batch per commit. The sleep lock went with the session's
			// relay lock.
			r.logger.WarnContext(ctx, "relay outbox", "error", err, "retry_in", r.cfg.PollInterval)
			l.wait(ctx, r.cfg.PollInterval, false)
			op = stayAwake
		case !locked:
			// Another relay publishes. Commits do not notify while it
			// works, so only the poll notices when it is gone.
			l.wait(ctx, r.cfg.PollInterval, true)
			op = stayAwake
		case asleep:
			// Commits notify from now on, and the claim that took the
			// lock saw the rows of those that held it before. The next
			// flush releases the lock with its first claim.
			pause = minBusyPause
			l.wait(ctx, r.cfg.PollInterval, true)
			op = wakeUp
		case !l.listening():
			// No session to be notified on: poll until there is one.
			l.wait(ctx, r.cfg.PollInterval, true)
			op = stayAwake
		default:
			// The flush ended with a claim that found nothing: sleep.
			if sent > 0 {
				pause = minBusyPause
			}
			op = goToSleep
		}
	}
}

// sleepOp is what a flush does with the relay's sleep lock, in the round
// trip of its first claim.
type sleepOp int

const (
	stayAwake sleepOp = iota
	// goToSleep tries the sleep lock ahead of the claim (and the marks),
	// which then sees every row committed without a notification. While
	// commits in progress hold the lock shared it is not had, and the claim
	// and the marks run all the same.
	goToSleep
	// wakeUp releases the sleep lock: commits stop notifying while the
	// relay works.
	wakeUp
)

// errCommitting is a flush's answer when it found nothing more to publish
// but could not take the sleep lock because producers are committing; it
// is no failure.
var errCommitting = errors.New("outbox commits in progress")

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
	conn, err := r.lead(ctx)
	if conn == nil {
		return 0, false, err
	}
	defer r.unlock(conn)
	sent, _, err = r.relay(ctx, conn, stayAwake, false)
	return sent, true, err
}

// lead returns a pooled connection whose session holds the relay lock, or
// nil when another relay holds it (and err is nil) or on an error. The
// caller hands it back with unlock.
func (r *Relay) lead(ctx context.Context) (*pgxpool.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, r.failed(fmt.Errorf("acquire outbox connection: %w", err))
	}
	locked, err := r.queries.TryRelayLock(ctx, conn, r.cfg.LockKey)
	if err != nil {
		// Whether the lock was taken is unknown: the session must end.
		r.closeConn(conn)
		return nil, r.failed(fmt.Errorf("outbox relay lock: %w", err))
	}
	if !locked {
		conn.Release()
		return nil, nil // another relay is publishing
	}
	return conn, nil
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

// batch is one claim of rows on its way through the relay: published in id
// order, then, once its acks are in, marked sent.
type batch struct {
	rows []dbsqlc.ClaimUnsentRow
	// published is closed once the publisher is done with the batch; the
	// fields below are the publisher's until then.
	published chan struct{}
	// stored counts the first rows acknowledged while they were published:
	// those of atomic batches, whose acks the publisher waits for.
	stored int
	// futures are the acks of rows[stored:stored+len(futures)], the rows
	// published one at a time.
	futures []jetstream.PubAckFuture
	// attempted tells whether a row was handed to the client, published or
	// not.
	attempted bool
	// spans are the same rows' send spans, when the relay traces.
	spans []trace.Span
	// pubErr is why publishing stopped before the end of rows.
	pubErr error
	// start is the first publish; deadline the end of the wait for acks.
	start, deadline time.Time
}

// relay publishes the outbox batch after batch and marks the batches sent in
// the order they were claimed, on conn, whose session holds the relay lock.
// It returns how many rows it marked sent, once a claim found nothing more
// to publish (or ctx is done, or an error cut it short). Its first claim
// carries op. With rest set, the claim that carries the last mark and is
// expected to find nothing also takes the sleep lock; relay reports
// whether the session holds the lock when it returns (asleep).
//
// Up to pipelineDepth batches are claimed and not yet marked at a time, and
// a goroutine of the flush publishes them, in order: while the database marks
// one batch and hands out the next, the client publishes and the broker
// stores the ones in between. A batch's mark goes to the database with the
// next claim, in one round trip: under load a batch costs one round trip,
// and when the outbox runs dry the claim that finds nothing carries the last
// mark.
func (r *Relay) relay(ctx context.Context, conn *pgxpool.Conn, op sleepOp, rest bool) (total int, asleep bool, err error) {
	// Batches in flight are finished even when ctx is canceled: their
	// messages may already be in the stream and should be marked sent.
	work := context.WithoutCancel(ctx)
	pubCtx, halt := context.WithCancel(work)
	defer halt()
	claimed := make(chan *batch, pipelineDepth)
	var wg sync.WaitGroup
	wg.Go(func() { r.publishAll(pubCtx, claimed) })
	defer wg.Wait()
	defer close(claimed)

	var (
		inFlight []*batch
		marks    marks  // of the batches settled since the last round trip
		more     = true // unsent rows may lie beyond the last claim
		claimErr error
		busy     bool // the sleep lock could not be had: commits in progress
	)
	asleep = op == wakeUp
	first := true
	for {
		for (more || marks.queued()) && claimErr == nil && len(inFlight) < pipelineDepth && ctx.Err() == nil {
			lock := stayAwake
			switch {
			case asleep:
				lock = wakeUp
			case first && op == goToSleep, rest && !more && len(inFlight) == 0 && !busy:
				lock = goToSleep
			}
			first = false
			rows, slept, err := r.claim(work, conn, inFlight, &marks, lock)
			total += r.marked(&marks, err)
			if err != nil {
				// Finish what is in flight first: the connection may
				// still be good enough to mark it.
				claimErr, more = err, false
				break
			}
			switch lock {
			case wakeUp:
				asleep = false
			case goToSleep:
				// Without the lock (commits in progress hold it shared)
				// the claim ran all the same, and the relay stays awake.
				asleep, busy = slept, !slept
			}
			if len(rows) == 0 {
				more = false
				break
			}
			more = rows[0].More
			b := &batch{rows: rows, published: make(chan struct{})}
			inFlight = append(inFlight, b)
			claimed <- b // never blocks: the channel holds pipelineDepth
		}
		if len(inFlight) == 0 {
			break
		}
		b := inFlight[0]
		inFlight = inFlight[1:]
		acked, err := r.settle(work, b)
		r.queueMark(&marks, b, acked, err)
		if err != nil {
			// The rows behind a failure stay unsent, acked or not, and are
			// published again in order with the same message ids. Halting
			// the publisher keeps as few of them as possible from going
			// out ahead of the failed one now.
			halt()
			for _, later := range inFlight {
				<-later.published
				r.abandon(later, err)
			}
			n, merr := r.sendMarks(work, conn, &marks)
			return total + n, asleep, cmp.Or(merr, err)
		}
	}
	// No claim carried the last marks: ctx is done, or a claim failed.
	n, err := r.sendMarks(work, conn, &marks)
	total += n
	switch {
	case err != nil:
		return total, asleep, err
	case claimErr != nil:
		return total, asleep, r.failed(claimErr)
	case more:
		return total, asleep, ctx.Err() // stopped early by ctx
	case busy && !asleep:
		return total, false, errCommitting
	}
	return total, asleep, nil
}

// marks are the marks of settled batches, queued to go to the database with
// the next statement on the relay's connection.
type marks []settled

// settled is a batch whose acks are in: its acked rows are to be marked
// sent, and err cut it short.
type settled struct {
	ids []int64 // of the acked rows, the batch's first ones, ascending
	err error
}

// queueMark queues on m the mark of b's first acked rows.
func (r *Relay) queueMark(m *marks, b *batch, acked int, err error) {
	*m = append(*m, settled{ids: appendIDs(make([]int64, 0, acked), b.rows[:acked]), err: err})
}

// pipeline returns the queued marks as statements, after lock's. For
// goToSleep, *slept is 1 once the pipeline was sent if the session got the
// sleep lock.
func (r *Relay) pipeline(m *marks, lock sleepOp, slept *int64) *postgres.Pipeline {
	var p postgres.Pipeline
	// Queued: the errors are Send's or Then's.
	switch lock {
	case goToSleep:
		_, _ = r.queries.TakeSleepLock(context.Background(), &p, sleepLockKey)
		p.CountInto(slept)
	case wakeUp:
		_ = r.queries.ReleaseSleepLock(context.Background(), &p, sleepLockKey)
	}
	for _, b := range *m {
		if len(b.ids) > 0 {
			_ = r.queries.MarkSent(context.Background(), &p, dbsqlc.MarkSentParams{FirstID: b.ids[0], LastID: b.ids[len(b.ids)-1], Ids: b.ids})
		}
	}
	return &p
}

func appendIDs(ids []int64, rows []dbsqlc.ClaimUnsentRow) []int64 {
	for _, row := range rows {
		ids = append(ids, row.ID)
	}
	return ids
}

func (m *marks) queued() bool { return len(*m) > 0 }

// marked reports the outcome of the queued marks, which went with a statement
// that returned err (a failure of either undoes both: they ran in one
// implicit transaction), and returns how many rows they marked. The queue is
// empty again.
func (r *Relay) marked(m *marks, err error) int {
	n := 0
	for _, b := range *m {
		acked := len(b.ids)
		if err != nil {
			acked, b.err = 0, fmt.Errorf("mark outbox rows sent: %w", err)
		}
		n += acked
		if r.batchDone != nil {
			r.batchDone(acked, b.err)
		}
	}
	*m = nil
	return n
}

// sendMarks sends the queued marks on their own and returns how many rows
// they marked.
func (r *Relay) sendMarks(ctx context.Context, conn *pgxpool.Conn, m *marks) (int, error) {
	if !m.queued() {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	defer cancel()
	err := r.pipeline(m, stayAwake, nil).Send(ctx, conn)
	n := r.marked(m, err)
	if err != nil {
		return n, fmt.Errorf("mark outbox rows sent: %w", err)
	}
	return n, nil
}

// claim returns the next batch of unsent rows in id order, leaving out the
// rows of the batches in flight; lock's statement and the queued marks go
// ahead of it, and for goToSleep, slept reports whether the session got the
// sleep lock. Each row tells whether more unsent rows lie beyond the batch.
func (r *Relay) claim(ctx context.Context, conn *pgxpool.Conn, inFlight []*batch, m *marks, lock sleepOp) (rows []dbsqlc.ClaimUnsentRow, slept bool, err error) {
	n := 0
	for _, b := range inFlight {
		n += len(b.rows)
	}
	ids := make([]int64, 0, n)
	for _, b := range inFlight {
		ids = appendIDs(ids, b.rows)
	}
	ctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	defer cancel()
	var locked int64
	rows, err = r.queries.ClaimUnsent(ctx, r.pipeline(m, lock, &locked).Then(conn), dbsqlc.ClaimUnsentParams{InFlight: ids, BatchSize: int64(r.cfg.BatchSize)})
	if err != nil {
		return nil, false, fmt.Errorf("claim outbox rows: %w", err)
	}
	return rows, locked == 1, nil
}

// publishAll publishes the batches it receives, one after the other, until
// batches is closed. After a batch that could not be published to its end,
// it publishes nothing more: a later row of the same aggregate must not
// reach the stream before the one that could not be sent.
func (r *Relay) publishAll(ctx context.Context, batches <-chan *batch) {
	var stopped error
	for b := range batches {
		if stopped == nil {
			r.publish(ctx, b)
			stopped = b.pubErr
		} else {
			b.pubErr = fmt.Errorf("not published, behind a failed publish: %w", stopped)
		}
		close(b.published)
	}
}

// publish publishes the rows of b in order. It stops at the first row that
// cannot be sent, and when ctx is done.
//
// A batch of at least AtomicBatchMin rows goes as atomic batches of at most
// maxAtomicBatch messages, each acknowledged before the next is sent, so
// that a refused one, which stored none of its messages, has none of the
// rows behind it stored ahead of it. Any other batch is published one
// message at a time without waiting for the acks.
func (r *Relay) publish(ctx context.Context, b *batch) {
	b.start = time.Now()
	b.deadline = b.start.Add(r.cfg.PublishTimeout)
	if r.tracer != nil {
		b.spans = make([]trace.Span, 0, len(b.rows))
	}
	b.pubErr = r.publishRows(ctx, b)
}

// publishRows is publish's work; it returns why it stopped before the end
// of b's rows.
func (r *Relay) publishRows(ctx context.Context, b *batch) error {
	if r.cfg.AtomicBatchMin == 0 || len(b.rows) < r.cfg.AtomicBatchMin {
		return r.publishEach(ctx, b, b.rows)
	}
	for lo := 0; lo < len(b.rows); lo += maxAtomicBatch {
		err := r.publishAtomic(ctx, b, b.rows[lo:min(lo+maxAtomicBatch, len(b.rows))])
		if errors.Is(err, jetstreamext.ErrBatchPublishDuplicateMsgID) {
			// Some of its messages were stored before (a relay died before
			// it marked them, or they were re-driven): the broker refuses
			// them twice in an atomic batch and drops them published one at
			// a time. Nothing behind the batch has been published yet.
			r.logger.DebugContext(ctx, "atomic batch refused for a message stored before; publishing a message at a time", "events", len(b.rows)-lo)
			if r.tracer != nil {
				for _, span := range b.spans[lo:] {
					endSpan(span, err)
				}
				b.spans = b.spans[:lo]
			}
			return r.publishEach(ctx, b, b.rows[lo:])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// publishEach publishes rows, the last of b, one message at a time without
// waiting for their acks.
func (r *Relay) publishEach(ctx context.Context, b *batch, rows []dbsqlc.ClaimUnsentRow) error {
	b.futures = make([]jetstream.PubAckFuture, 0, len(rows))
	for _, row := range rows {
		msg, err := r.nextMessage(ctx, b, row)
		if err != nil {
			return err
		}
		f, err := r.js.PublishMsgAsync(msg, r.noRetry)
		if err != nil {
			return fmt.Errorf("publish event %s: %w", row.EventID, err)
		}
		b.futures = append(b.futures, f)
	}
	return nil
}

// publishAtomic publishes rows, the next of b, as one atomic batch
// (jetstreamext, ADR-50): every message but the last as a plain NATS
// publish, the last with the commit, whose ack stands for the batch. It
// waits for that ack, and counts the rows stored.
func (r *Relay) publishAtomic(ctx context.Context, b *batch, rows []dbsqlc.ClaimUnsentRow) error {
	msgs := make([]*nats.Msg, len(rows))
	for i, row := range rows {
		msg, err := r.nextMessage(ctx, b, row)
		if err != nil {
			return err
		}
		msgs[i] = msg
	}
	pctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	// Without flow control: the library would wait for an ack of the first
	// message, a round trip per batch that a batch of at most
	// maxAtomicBatch messages does not need.
	if _, err := jetstreamext.PublishMsgBatch(pctx, r.js, msgs, jetstreamext.BatchFlowControl{}); err != nil {
		return fmt.Errorf("publish events %s to %s as an atomic batch: %w", rows[0].EventID, rows[len(rows)-1].EventID, err)
	}
	b.stored += len(rows)
	return nil
}

// nextMessage makes the message of row, the next of b, and marks b
// attempted; it fails when row cannot be sent or ctx is done.
func (r *Relay) nextMessage(ctx context.Context, b *batch, row dbsqlc.ClaimUnsentRow) (*nats.Msg, error) {
	if ctx.Err() != nil {
		return nil, fmt.Errorf("publish event %s: halted", row.EventID)
	}
	msg, err := message(row)
	if err != nil {
		return nil, err
	}
	if r.tracer != nil {
		b.spans = append(b.spans, r.startSend(ctx, row, msg))
	}
	b.attempted = true
	return msg, nil
}

// settle waits for the acks of b. It returns how many of its first rows
// were acknowledged, to be marked sent, and the error that cut the batch
// short.
func (r *Relay) settle(ctx context.Context, b *batch) (int, error) {
	<-b.published
	acked, err := r.await(ctx, b)
	r.observePublish(b, acked, err)
	if acked > 0 && r.afterPublish != nil {
		if herr := r.afterPublish(); herr != nil {
			return 0, herr
		}
	}
	return acked, err
}

// await waits for the acks of b in order. It returns the length of the
// prefix of rows that were all acknowledged, and the error of the first row
// that was not. Rows after that one may be in the stream, but they are
// published again with the same message id.
func (r *Relay) await(ctx context.Context, b *batch) (acked int, err error) {
	timeout := time.NewTimer(time.Until(b.deadline))
	defer timeout.Stop()
	duplicates := 0
	for i, f := range b.futures {
		row := b.rows[b.stored+i]
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				duplicates++
			}
		case err := <-f.Err():
			return b.stored + i, fmt.Errorf("publish event %s: %w", row.EventID, err)
		case <-timeout.C:
			return b.stored + i, fmt.Errorf("publish event %s: no ack within %s", row.EventID, r.cfg.PublishTimeout)
		}
	}
	acked = b.stored + len(b.futures)
	if acked > 0 {
		r.logger.DebugContext(ctx, "outbox batch published", "events", acked, "atomically", b.stored, "duplicates", duplicates)
	}
	return acked, b.pubErr
}

// abandon gives up a batch in flight behind a batch that failed with cause:
// none of its rows is marked sent, whether or not its acks came back.
func (r *Relay) abandon(b *batch, cause error) {
	err := fmt.Errorf("behind a failed publish: %w", cause)
	r.observePublish(b, 0, err)
	if r.batchDone != nil {
		r.batchDone(0, err)
	}
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

// message is the NATS message of an outbox row. Its Nats-Msg-Id is the
// event id (see event.Envelope.Msg), which the broker deduplicates on. The
// subject is the one the row was written with, so that the subject an event
// travels on is decided once, at Enqueue.
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

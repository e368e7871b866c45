package outbox

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// maxInFlight is how many batches a pipelined relay may have published and
// not yet recorded at a time: one that the broker is acknowledging while
// the database records the one before it and hands out the one after. The plain relay has one.
const maxInFlight = 2

// inFlightLimit is how many batches r has in flight at most.
func (r *Relay) inFlightLimit() int {
	if r.cfg.Pipelined {
		return maxInFlight
	}
	return 1
}

// position is what the relay's claims cover (see outbox_batch in
// db/migrations/platform/00013): every outbox row with an id up to upto
// whose transaction is visible in the snapshot snap, and those up to
// spanDone visible in spanSnap, the snapshot of the span being published
// (up to spanUpto; closed when spanDone is spanUpto).
type position struct {
	snap               string // pg_snapshots, as text
	upto               int64
	spanSnap           string
	spanUpto, spanDone int64
	epoch              int64 // the latest redrive when the claims began; see recordedPosition
	systemID           int64 // the cluster's, recorded with it
}

// recordedPosition as a position's epoch makes the next claim start from the
// recorded position, as the first claim of every flush does: whatever the
// flushes before did not record is claimed again.
const recordedPosition = -1

// nothingCovered is the snapshot of the position that covers no row (what
// outbox_position returns when nothing was recorded).
const nothingCovered = "1:1:"

// after is the position that covers the first acked rows of a claim and
// what p covered: the claim's span up to the last of them, or, when they
// are the span's last rows, the span itself.
func after(rows []dbsqlc.ClaimRow, acked int, systemID int64) position {
	c := rows[0] // every row carries its claim's position and span
	p := position{snap: c.Snap, upto: c.Upto, spanSnap: c.SpanSnap, spanUpto: c.SpanUpto,
		spanDone: rows[acked-1].ID, epoch: c.Epoch, systemID: systemID}
	if acked == len(rows) && c.Closes {
		p.snap, p.upto, p.spanDone = c.SpanSnap, c.SpanUpto, c.SpanUpto
	}
	return p
}

func (p position) record() dbsqlc.RecordBatchParams {
	return dbsqlc.RecordBatchParams{Snap: p.snap, Upto: p.upto, SpanSnap: p.spanSnap, SpanUpto: p.spanUpto,
		SpanDone: p.spanDone, Epoch: p.epoch, SystemID: p.systemID}
}

// batch is one claim of rows on its way through the relay: published in id
// order, then, once its acks are in, recorded as sent.
type batch struct {
	rows     []dbsqlc.ClaimRow
	systemID int64
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
	// start is the first publish, handed the end of the last; deadline
	// the end of the wait for acks.
	start, handed, deadline time.Time
}

// relay publishes the outbox batch after batch and records the batches in
// the order they were claimed, on conn, whose session holds the relay lock.
// It returns how many rows it marked sent, once a claim found nothing more
// to publish (or ctx is done, or an error cut it short). Its first claim
// carries op. With rest set, the claim that carries the last mark and is
// expected to find nothing also takes the sleep lock; relay reports
// whether the session holds the lock when it returns (asleep).
//
// Up to inFlightLimit batches are claimed and not yet recorded at a time,
// and a goroutine of the flush publishes them, in order: while the database
// marks one batch and hands out the next, the client publishes and the broker
// stores the ones in between. A batch's mark goes to the database with the
// next claim, in one round trip: under load a batch costs one round trip,
// and when the outbox runs dry the claim that finds nothing carries the last
// mark.
func (r *Relay) relay(ctx context.Context, conn *pgxpool.Conn, systemID int64, op sleepOp, rest bool) (total int, asleep bool, err error) {
	// Batches in flight are finished even when ctx is canceled: their
	// messages may already be in the stream and should be marked sent.
	work := context.WithoutCancel(ctx)
	pubCtx, halt := context.WithCancel(work)
	defer halt()
	claimed := make(chan *batch, r.inFlightLimit())
	var wg sync.WaitGroup
	wg.Go(func() { r.publishAll(pubCtx, claimed) })
	defer wg.Wait()
	defer close(claimed)

	f := &flushRun{r: r, conn: conn, work: work, claimed: claimed, op: op, rest: rest,
		pos: position{snap: nothingCovered, spanSnap: nothingCovered, epoch: recordedPosition, systemID: systemID}, more: true, asleep: op == wakeUp, first: true}
	for {
		f.claimBatches(ctx)
		if len(f.inFlight) == 0 {
			return f.finish(ctx)
		}
		if err := f.awaitNext(); err != nil {
			// The rows behind a failure stay unsent, acked or not, and are
			// published again in order with the same message ids. Halting
			// the publisher keeps as few of them as possible from going
			// out ahead of the failed one now.
			halt()
			return f.abandonInFlight(err)
		}
	}
}

// flushRun is the state of one relay call.
type flushRun struct {
	r       *Relay
	conn    *pgxpool.Conn
	work    context.Context // the flush's context, not canceled with ctx
	claimed chan<- *batch   // to the publisher
	op      sleepOp         // the first claim's
	rest    bool

	inFlight []*batch // claimed, acks not yet awaited, oldest first
	pos      position // after the last claim: what the batches so far cover
	marks    marks    // of the batches acked since the last round trip
	more     bool     // unsent rows may lie beyond the last claim
	claimErr error
	busy     bool // the sleep lock could not be had: commits in progress
	asleep   bool // the session holds the sleep lock
	first    bool // no claim made yet
	total    int  // rows marked sent
}

// claimBatches claims batches, each claim carrying the queued marks, and
// hands them to the publisher, until inFlightLimit are in flight, nothing
// more is unsent and no record is queued, a claim failed, or ctx is done.
func (f *flushRun) claimBatches(ctx context.Context) {
	for (f.more || f.marks.queued()) && f.claimErr == nil && len(f.inFlight) < f.r.inFlightLimit() && ctx.Err() == nil {
		lock := f.nextLock()
		rows, slept, err := f.r.claim(f.work, f.conn, f.pos, &f.marks, lock)
		f.total += f.r.marked(&f.marks, err)
		if err != nil {
			// Finish what is in flight first: the connection may
			// still be good enough to mark it.
			f.claimErr, f.more = err, false
			return
		}
		switch lock {
		case wakeUp:
			f.asleep = false
		case goToSleep:
			// Without the lock (commits in progress hold it shared)
			// the claim ran all the same, and the relay stays awake.
			f.asleep, f.busy = slept, !slept
		}
		if len(rows) == 0 {
			f.more = false
			return
		}
		// A full batch may have more behind it; the next claim tells.
		f.more = len(rows) == f.r.cfg.BatchSize
		b := &batch{rows: rows, systemID: f.pos.systemID, published: make(chan struct{})}
		f.pos = after(rows, len(rows), f.pos.systemID)
		f.inFlight = append(f.inFlight, b)
		f.claimed <- b // never blocks: the channel holds inFlightLimit
	}
}

// nextLock is what the next claim does with the sleep lock.
func (f *flushRun) nextLock() sleepOp {
	lock := stayAwake
	switch {
	case f.asleep:
		lock = wakeUp
	case f.first && f.op == goToSleep, f.rest && !f.more && len(f.inFlight) == 0 && !f.busy:
		lock = goToSleep
	}
	f.first = false
	return lock
}

// awaitNext waits for the acks of the oldest batch in flight and queues
// its mark; it returns the error that cut the batch short.
func (f *flushRun) awaitNext() error {
	b := f.inFlight[0]
	f.inFlight = f.inFlight[1:]
	acked, err := f.r.awaitBatch(f.work, b)
	f.r.queueMark(&f.marks, b, acked, err)
	return err
}

// abandonInFlight gives up the batches in flight behind one that failed
// with err, and sends the marks queued before it.
func (f *flushRun) abandonInFlight(err error) (int, bool, error) {
	for _, later := range f.inFlight {
		<-later.published
		f.r.abandon(later, err)
	}
	n, merr := f.r.sendMarks(f.work, f.conn, &f.marks)
	return f.total + n, f.asleep, cmp.Or(merr, err)
}

// finish sends the marks no claim carried (ctx is done, or a claim failed)
// and returns relay's results.
func (f *flushRun) finish(ctx context.Context) (int, bool, error) {
	n, err := f.r.sendMarks(f.work, f.conn, &f.marks)
	f.total += n
	switch {
	case err != nil:
		return f.total, f.asleep, err
	case f.claimErr != nil:
		return f.total, f.asleep, f.r.failed(f.claimErr)
	case f.more:
		return f.total, f.asleep, ctx.Err() // stopped early by ctx
	case f.busy && !f.asleep:
		return f.total, false, errCommitting
	}
	return f.total, f.asleep, nil
}

// claim returns the next batch of unsent rows in id order, the lowest ids
// that pos does not cover; lock's statement and the queued marks go ahead of
// it, and for goToSleep, slept reports whether the session got the sleep
// lock. Every row carries the position after the claim.
func (r *Relay) claim(ctx context.Context, conn *pgxpool.Conn, pos position, m *marks, lock sleepOp) (rows []dbsqlc.ClaimRow, slept bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.dbTimeout())
	defer cancel()
	start := time.Now()
	var locked int64
	rows, err = r.queries.Claim(ctx, r.markStatements(m, lock, &locked).Then(conn), dbsqlc.ClaimParams{
		Snap: pos.snap, Upto: pos.upto, SpanSnap: pos.spanSnap, SpanUpto: pos.spanUpto, SpanDone: pos.spanDone,
		Epoch: pos.epoch, BatchSize: int64(r.cfg.BatchSize),
	})
	r.cfg.Observer.Step(StepClaim, time.Since(start))
	if len(rows) > 0 {
		r.cfg.Observer.Step(StepWait, max(start.Sub(rows[0].CreatedAt), 0))
	}
	if err != nil {
		return nil, false, fmt.Errorf("claim outbox rows: %w", err)
	}
	return rows, locked == 1, nil
}

// marks are the positions of acked batches, queued to go to the database
// with the next statement on the relay's connection.
type marks []ackedBatch

// ackedBatch is a batch whose acks are in: rows of its first rows were
// acknowledged, and err cut it short.
type ackedBatch struct {
	rows   int
	record dbsqlc.RecordBatchParams // what covers them; unused without rows
	err    error
}

// queueMark queues on m the position that covers b's first acked rows.
func (r *Relay) queueMark(m *marks, b *batch, acked int, err error) {
	a := ackedBatch{rows: acked, err: err}
	if acked > 0 {
		a.record = after(b.rows, acked, b.systemID).record()
	}
	*m = append(*m, a)
}

// markStatements returns the queued marks as statements, after lock's. For
// goToSleep, *slept is 1 once the statements were sent if the session got
// the sleep lock.
func (r *Relay) markStatements(m *marks, lock sleepOp, slept *int64) *postgres.Pipeline {
	var p postgres.Pipeline
	// Queued: the errors are Send's or Then's.
	switch lock {
	case goToSleep:
		_, _ = r.queries.TakeSleepLock(context.Background(), &p)
		p.CountInto(slept)
	case wakeUp:
		_ = r.queries.ReleaseSleepLock(context.Background(), &p)
	}
	for _, b := range *m {
		if b.rows > 0 {
			_ = r.queries.RecordBatch(context.Background(), &p, b.record)
		}
	}
	return &p
}

func (m *marks) queued() bool { return len(*m) > 0 }

// marked reports the outcome of the queued marks, which went with a statement
// that returned err (a failure of either undoes both: they ran in one
// implicit transaction), and returns how many rows they marked. The queue is
// empty again.
func (r *Relay) marked(m *marks, err error) int {
	n := 0
	for _, b := range *m {
		acked := b.rows
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
	start := time.Now()
	err := r.markStatements(m, stayAwake, nil).Send(ctx, conn)
	r.cfg.Observer.Step(StepRecord, time.Since(start))
	n := r.marked(m, err)
	if err != nil {
		return n, fmt.Errorf("mark outbox rows sent: %w", err)
	}
	return n, nil
}

// awaitBatch waits until b is published and its acks are in. It returns
// how many of its first rows were acknowledged, to be marked sent, and the
// error that cut the batch short.
func (r *Relay) awaitBatch(ctx context.Context, b *batch) (int, error) {
	<-b.published
	acked, err := r.awaitAcks(ctx, b)
	r.observePublish(b, acked, err)
	if acked > 0 && r.afterPublish != nil {
		if herr := r.afterPublish(); herr != nil {
			return 0, herr
		}
	}
	return acked, err
}

// awaitAcks waits for the acks of b in order. It returns the length of the
// prefix of rows that were all acknowledged, and the error of the first row
// that was not. Rows after that one may be in the stream, but they are
// published again with the same message id.
func (r *Relay) awaitAcks(ctx context.Context, b *batch) (acked int, err error) {
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

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

// pipelineDepth is how many batches may be published and not yet marked
// sent at a time: one that the broker is acknowledging while the database
// marks the one before it and hands out the one after.
const pipelineDepth = 2

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

	f := &flushRun{r: r, conn: conn, work: work, claimed: claimed, op: op, rest: rest,
		more: true, asleep: op == wakeUp, first: true}
	for {
		f.claimAhead(ctx)
		if len(f.inFlight) == 0 {
			return f.finish(ctx)
		}
		if err := f.settleNext(); err != nil {
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

	inFlight []*batch // claimed, not yet settled, oldest first
	marks    marks    // of the batches settled since the last round trip
	more     bool     // unsent rows may lie beyond the last claim
	claimErr error
	busy     bool // the sleep lock could not be had: commits in progress
	asleep   bool // the session holds the sleep lock
	first    bool // no claim made yet
	total    int  // rows marked sent
}

// claimAhead claims batches, each claim carrying the queued marks, and
// hands them to the publisher, until pipelineDepth are in flight, nothing
// more is unsent and no mark is queued, a claim failed, or ctx is done.
func (f *flushRun) claimAhead(ctx context.Context) {
	for (f.more || f.marks.queued()) && f.claimErr == nil && len(f.inFlight) < pipelineDepth && ctx.Err() == nil {
		lock := f.nextLock()
		rows, slept, err := f.r.claim(f.work, f.conn, f.inFlight, &f.marks, lock)
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
		f.more = rows[0].More
		b := &batch{rows: rows, published: make(chan struct{})}
		f.inFlight = append(f.inFlight, b)
		f.claimed <- b // never blocks: the channel holds pipelineDepth
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

// settleNext waits for the acks of the oldest batch in flight and queues
// its mark; it returns the error that cut the batch short.
func (f *flushRun) settleNext() error {
	b := f.inFlight[0]
	f.inFlight = f.inFlight[1:]
	acked, err := f.r.settle(f.work, b)
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

// marks are the marks of settled batches, queued to go to the database with
// the next statement on the relay's connection.
type marks []settled

// settled is a batch whose acks are in: its acked rows are to be marked
// sent, and err cut it short.
type settled struct {
	mark dbsqlc.MarkSentParams // of the acked rows, the batch's first ones
	err  error
}

// queueMark queues on m the mark of b's first acked rows.
func (r *Relay) queueMark(m *marks, b *batch, acked int, err error) {
	*m = append(*m, settled{mark: markOf(b.rows, acked), err: err})
}

// markOf is the mark of the first acked of rows, a claim's. It records the
// position that the claim found only when every row of the claim was
// acked (the position says that all of them are sent; a batch cut short
// leaves the position of the mark before it, from which the rows it did
// not mark are found again), and, in MarkSent, only when no redrive came
// since the claim (Epoch).
func markOf(rows []dbsqlc.ClaimUnsentRow, acked int) dbsqlc.MarkSentParams {
	m := dbsqlc.MarkSentParams{Ids: make([]int64, acked), CreatedAts: make([]time.Time, acked), ResumeXip: []int64{}}
	for i, row := range rows[:acked] {
		m.Ids[i], m.CreatedAts[i] = row.ID, row.CreatedAt
	}
	if acked > 0 && acked == len(rows) {
		claim := rows[0] // every row of a claim carries its position
		m.Resume, m.ResumeID, m.ResumeXmax, m.ResumeXip, m.Epoch = true, claim.ResumeID, claim.ResumeXmax, claim.ResumeXip, claim.Epoch
	}
	return m
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
		if len(b.mark.Ids) > 0 {
			_ = r.queries.MarkSent(context.Background(), &p, b.mark)
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
		acked := len(b.mark.Ids)
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

package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

// Headers a dead-lettered message carries besides the original's.
const (
	HeaderDLQReason     = "Onceflow-Dlq-Reason"     // why it could not be processed
	HeaderDLQConsumer   = "Onceflow-Dlq-Consumer"   // the durable that gave up on it
	HeaderDLQStream     = "Onceflow-Dlq-Stream"     // the stream it is stored in
	HeaderDLQStreamSeq  = "Onceflow-Dlq-Stream-Seq" // its sequence there
	HeaderDLQDeliveries = "Onceflow-Dlq-Deliveries" // how often it was delivered
	HeaderDLQSubject    = "Onceflow-Dlq-Subject"    // the subject it was published on
)

// maxReasonLen keeps a reason header readable; error chains can be long.
const maxReasonLen = 1024

// outcome is what became of a delivery's processing.
type outcome int

const (
	pending   outcome = iota // not processed yet
	processed                // the handler's writes and the claim are committed
	duplicate                // the event was processed before
	failed                   // nothing was committed for it; err says why
)

// delivery is one decoded message on its way through the inbox.
type delivery struct {
	msg     jetstream.Msg
	meta    *jetstream.MsgMetadata
	ev      event.Envelope
	outcome outcome
	err     error
}

// redelivered reports whether d's message was delivered before: its event
// may have been processed, and its claim asks before the handler runs.
func (d *delivery) redelivered() bool { return d.meta.NumDelivered > 1 }

func (d *delivery) fail(err error) {
	d.outcome, d.err = failed, err
}

// processEach processes each message in a transaction of its own, and then
// settles them all: their acks leave together, in one write to the broker
// where one each took a system call on each side, about as much CPU as an
// event's transaction. An ack waits for the batch's last commit, well
// within the consumer's AckWait.
func (c *Consumer) processEach(ctx context.Context, msgs []jetstream.Msg) {
	ds := make([]*delivery, 0, len(msgs))
	for _, msg := range msgs {
		if d, ok := c.decode(ctx, msg); ok {
			c.processTx(ctx, d)
			ds = append(ds, d)
		}
	}
	for _, d := range ds {
		c.settle(ctx, d)
	}
}

// decode reads msg's envelope and applies the retention guard. A message
// that fails either is dead-lettered here, and ok is false.
func (c *Consumer) decode(ctx context.Context, msg jetstream.Msg) (d *delivery, ok bool) {
	meta, err := msg.Metadata()
	if err != nil {
		// Only a message that did not come from a consumer lacks metadata,
		// and it could not be acked either.
		c.logger.ErrorContext(ctx, "message without JetStream metadata", "subject", msg.Subject(), "err", err)
		return nil, false
	}
	d = &delivery{msg: msg, meta: meta}
	if d.ev, err = event.FromMsg(msg.Headers(), msg.Data()); err != nil {
		c.deadLetter(ctx, d, fmt.Sprintf("decode: %v", err))
		return nil, false
	}
	// The Cleaner deletes the processed_events row of an event minted
	// more than the retention period (and its margin) ago, so a redelivery
	// of it would not be recognised: it is dead-lettered instead. An event whose own time
	// is that old is too, whatever its id says, so that an event that
	// claims to be ancient is never processed blindly.
	born := d.ev.Time
	if minted := d.ev.Minted(); minted.Before(born) {
		born = minted
	}
	if age := time.Since(born); age > c.cfg.Retention {
		c.deadLetter(ctx, d, fmt.Sprintf("event %s is %s old, beyond the inbox retention of %s: it may have been processed already",
			d.ev.ID, age.Round(time.Second), c.cfg.Retention))
		return nil, false
	}
	return d, true
}

// processTx claims d's event, runs the handler and commits, all in one
// transaction. It records the outcome in d; the deferred rollback happens
// before the message is settled, so a failure leaves nothing behind.
func (c *Consumer) processTx(ctx context.Context, d *delivery) {
	t := c.startTx(1)
	defer func() { t.done(d.err) }()
	begin := postgres.BeginWith(c.pool)
	defer begin.End(ctx)
	claim := dbsqlc.ClaimEventParams{
		Consumer:  c.cfg.Durable,
		EventID:   d.ev.ID,
		EventType: string(d.ev.Type),
		EventTime: d.ev.Time,
		StreamSeq: int64(d.meta.Sequence.Stream),
	}
	if d.redelivered() {
		// A redelivery may have been processed before: the claim asks, in
		// BEGIN's round trip, before the handler runs.
		_, err := c.queries.ClaimEvent(ctx, begin, claim)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			d.outcome = duplicate
			return
		case err != nil:
			d.fail(fmt.Errorf("claim: %w", err))
			return
		}
	} else {
		// A first delivery was not processed before, unless it was
		// published again past the broker's duplicate window: its claim
		// goes ahead of the handler's first statement (see claimAhead),
		// and if the bet is lost, the event is a duplicate.
		ahead, claimErr := claimAhead(begin)
		_ = c.queries.ClaimNewEvent(ctx, ahead, dbsqlc.ClaimNewEventParams(claim)) // queued
		defer func() {
			if d.outcome == processed {
				return
			}
			switch err := claimErr(ctx); {
			case postgres.IsUniqueViolation(err):
				d.outcome, d.err = duplicate, nil
			case err != nil:
				d.fail(fmt.Errorf("claim: %w", err))
			}
		}()
	}
	// The handler's :exec writes go with its next read, or the COMMIT.
	wb := postgres.WriteBehind(begin.Tx())
	end, herr := c.handle(ctx, wb, 0, d.ev)
	defer end()
	if werr := wb.Err(); werr != nil {
		herr = werr // what failed the handler's next statement, if any
	}
	if herr != nil {
		d.fail(fmt.Errorf("handler: %w", herr))
		return
	}
	// A failed commit may still have happened (the connection broke after
	// the server committed); then the redelivery is dropped as a duplicate.
	if err := begin.Commit(ctx, wb.Writes()); err != nil {
		if werr := wb.Err(); werr != nil {
			d.fail(fmt.Errorf("handler: %w", werr))
		} else {
			d.fail(fmt.Errorf("commit: %w", err))
		}
		return
	}
	d.outcome = processed
}

// processBatch processes a batch, in one transaction when no handler
// fails, and settles each of its messages.
func (c *Consumer) processBatch(ctx context.Context, msgs []jetstream.Msg) {
	ds := make([]*delivery, 0, len(msgs))
	for _, msg := range msgs {
		if d, ok := c.decode(ctx, msg); ok {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return
	}
	// The same event twice in one batch (a publish that bypassed the
	// broker's dedup) is claimed once; the later copies are duplicates,
	// settled with the first: none of them is acked uncommitted.
	unique := make([]*delivery, 0, len(ds))
	firsts := make(map[uuid.UUID]*delivery, len(ds))
	copies := make(map[*delivery]*delivery) // second copy → first
	for _, d := range ds {
		if f, ok := firsts[d.ev.ID]; ok {
			copies[d] = f
			continue
		}
		firsts[d.ev.ID] = d
		unique = append(unique, d)
	}
	c.runBatch(ctx, unique)
	for _, d := range ds {
		if f, ok := copies[d]; ok {
			d.outcome, d.err = duplicate, nil
			if f.outcome == failed {
				// Not acked before its original is committed.
				d.fail(f.err)
			}
		}
		c.settle(ctx, d)
	}
}

// runBatch commits the new events of ds, claimed and handled in one
// transaction when every handler succeeds. A batch takes no savepoints,
// which would cost two round trips each: when a handler fails, the
// transaction is rolled back and the batch run again in a new one, without
// the failed event, or with the per-event handler when the batch handler
// failed. So a failure undoes only its own event, at the cost of running
// the events before it again. It records every delivery's outcome.
//
// A batch of first deliveries is claimed on the bet that none of its
// events was processed before (see batchTx). The bet is lost only by an
// event published again after the broker's duplicate window (a re-drive, a
// producer that re-emits) or by a batch that repeats an event; the batch is
// then run again, claimed as a batch with a redelivery is at once: asking
// which of its events are new before the handlers run.
func (c *Consumer) runBatch(ctx context.Context, ds []*delivery) {
	setBased := c.cfg.BatchHandler != nil
	bet := !slices.ContainsFunc(ds, (*delivery).redelivered)
	for len(ds) > 0 {
		failed, herr, err := c.batchTx(ctx, ds, setBased, bet)
		switch {
		case errors.Is(err, errProcessedBefore) && bet:
			c.logger.DebugContext(ctx, "a batch of first deliveries holds an event processed before; claiming it again", "events", len(ds))
			bet = false
		case err != nil:
			// Nothing of the batch was committed: every message is retried.
			for _, d := range ds {
				d.fail(err)
			}
			return
		case herr == nil:
			return
		case failed < 0:
			c.logger.WarnContext(ctx, "batch handler failed; processing the batch event by event", "events", len(ds), "err", herr)
			setBased = false
		default:
			ds[failed].fail(fmt.Errorf("handler: %w", herr))
			ds = slices.Delete(slices.Clone(ds), failed, failed+1)
		}
	}
}

// errProcessedBefore is the failure of a batch's claim on the bet that its
// events are new, when one of them is not.
var errProcessedBefore = errors.New("an event of the batch was processed before")

// batchTx claims the events of ds with one statement, runs the handlers for
// the new ones in delivery order — the batch handler when setBased — and
// commits, recording each delivery's outcome. When a handler fails it rolls
// back and returns the failed event's index in ds (-1 for the batch
// handler) and the handler's error; err is the failure of the transaction
// as a whole.
//
// With bet, the claim is a plain insert of every event, which costs
// PostgreSQL less than ON CONFLICT and needs no answer: it goes ahead of
// the handlers' first statement (see claimAhead), and the handlers get
// every event. If one was processed before, the claim fails, the
// transaction with it, and err is errProcessedBefore. Without bet, the
// claim asks which events are new (ON CONFLICT DO NOTHING), in BEGIN's
// round trip, and the handlers get those.
func (c *Consumer) batchTx(ctx context.Context, ds []*delivery, setBased, bet bool) (failed int, herr, err error) {
	t := c.startTx(len(ds))
	defer func() { t.done(errors.Join(err, herr)) }() // a failed handler rolled it back too
	// Claimed in event id order (the query sorts too), so that two batches
	// that overlap after a redelivery lock their keys in the same order and
	// cannot deadlock.
	byID := slices.SortedFunc(slices.Values(ds), func(a, b *delivery) int {
		return bytes.Compare(a.ev.ID[:], b.ev.ID[:])
	})
	claim := dbsqlc.ClaimEventsParams{
		Consumer:   c.cfg.Durable,
		EventIds:   make([]uuid.UUID, len(byID)),
		EventTypes: make([]string, len(byID)),
		EventTimes: make([]time.Time, len(byID)),
		StreamSeqs: make([]int64, len(byID)),
	}
	for i, d := range byID {
		claim.EventIds[i] = d.ev.ID
		claim.EventTypes[i] = string(d.ev.Type)
		claim.EventTimes[i] = d.ev.Time
		claim.StreamSeqs[i] = int64(d.meta.Sequence.Stream)
	}
	begin := postgres.BeginWith(c.pool)
	defer begin.End(ctx)
	claimed := claim.EventIds
	if bet {
		ahead, claimErr := claimAhead(begin)
		_ = c.queries.ClaimNewEvents(ctx, ahead, dbsqlc.ClaimNewEventsParams(claim)) // queued
		defer func() {
			if err == nil && herr == nil {
				return
			}
			// If the claim failed, what carried it failed with it: the
			// handlers' and the transaction's failures are the claim's.
			switch cerr := claimErr(ctx); {
			case postgres.IsUniqueViolation(cerr):
				failed, herr, err = 0, nil, errProcessedBefore
			case cerr != nil:
				failed, herr, err = 0, nil, fmt.Errorf("claim: %w", cerr)
			}
		}()
	} else if claimed, err = c.queries.ClaimEvents(ctx, begin, claim); err != nil {
		return 0, nil, fmt.Errorf("claim: %w", err)
	}
	isNew := make(map[uuid.UUID]bool, len(claimed))
	for _, id := range claimed {
		isNew[id] = true
	}

	fresh := make([]event.Envelope, 0, len(claimed))
	for _, d := range ds {
		if isNew[d.ev.ID] {
			fresh = append(fresh, d.ev)
		}
	}
	// The handlers' writes go with the COMMIT: the set-based handler's
	// queued on writes, the per-event handlers' :exec statements behind
	// the next read (see postgres.WriteBehind), and what is left with the
	// COMMIT.
	var (
		writes    *postgres.Pipeline      // sent with the COMMIT
		writesErr error                   // the set-based handler's writes' failure
		wb        *postgres.WriteBehindTx // the per-event handlers' transaction
	)
	if len(fresh) > 0 {
		if setBased {
			// The handler's reads are planned for their arguments, its
			// writes with their generic plans. Queued: their errors are
			// the statements' behind them.
			_ = c.queries.PlanEachCall(ctx, begin.Ahead())
			writes = &postgres.Pipeline{}
			writes.AfterSend(func(err error) { writesErr = err })
			_ = c.queries.PlanGeneric(ctx, writes)
			end, herr := c.handleBatch(ctx, begin.Tx(), fresh, writes)
			defer end()
			if herr != nil {
				return -1, herr, nil
			}
		} else {
			wb = postgres.WriteBehind(begin.Tx())
			var ends []func() // of the handlers' observations
			defer func() {
				for _, end := range ends {
					end()
				}
			}()
			for i, d := range ds {
				if !isNew[d.ev.ID] {
					continue
				}
				wb.Own(i)
				end, herr := c.handle(ctx, wb, i, d.ev)
				ends = append(ends, end)
				if werr := wb.Err(); werr != nil {
					// An earlier write of its own or of an event before
					// it failed, which may be what failed the handler.
					return werr.Owner, werr.Err, nil
				}
				if herr != nil {
					return i, herr, nil
				}
			}
			writes = wb.Writes() // what the last handlers left queued
		}
	}
	if err := begin.Commit(ctx, writes); err != nil {
		switch {
		case wb != nil && wb.Err() != nil:
			return wb.Err().Owner, wb.Err().Err, nil
		case writesErr != nil:
			return -1, writesErr, nil // the handler's failure, as if it had sent them
		}
		return 0, nil, fmt.Errorf("commit: %w", err)
	}
	for _, d := range ds {
		if isNew[d.ev.ID] {
			d.outcome = processed
		} else {
			d.outcome = duplicate
		}
	}
	return 0, nil, nil
}

// claimAhead returns begin's Ahead pipeline, on which the caller queues a
// claim that needs no answer, and claimErr, which gives the claim's
// failure. The claim goes to the server in the round trip of the handler's
// first statement, after BEGIN, or with the COMMIT if the handler sends
// none: one round trip less than a claim sent on its own. The handler runs
// before the claim is answered; if the claim fails, every statement behind
// it fails with its error, and the transaction cannot commit. Call
// claimErr when something failed: if nothing has carried the claim yet
// (the handler failed before its first statement), it sends the claim, so
// that an event processed before is a duplicate, not a failure of its
// handler.
func claimAhead(begin *postgres.TxStart) (ahead *postgres.Pipeline, claimErr func(context.Context) error) {
	var (
		sent bool
		err  error
	)
	ahead = begin.Ahead()
	ahead.AfterSend(func(e error) { sent, err = true, e })
	return ahead, func(ctx context.Context) error {
		if !sent {
			_ = begin.SendAhead(ctx) // its failure is the claim's, or BEGIN's
		}
		return err
	}
}

// settle acks, naks or dead-letters d's message according to its outcome.
// It runs only after d's transaction committed or rolled back.
func (c *Consumer) settle(ctx context.Context, d *delivery) {
	switch d.outcome {
	case processed, duplicate:
		if d.outcome == processed {
			c.processed.Add(1)
			c.cfg.Observer.Settled(d.ev, OutcomeProcessed, d.meta.NumDelivered)
		} else {
			c.duplicates.Add(1)
			c.cfg.Observer.Settled(d.ev, OutcomeDuplicate, d.meta.NumDelivered)
			c.logger.DebugContext(ctx, "duplicate dropped", "event_id", d.ev.ID, "stream_seq", d.meta.Sequence.Stream)
		}
		if d.outcome == processed && c.cfg.AfterCommit != nil {
			c.cfg.AfterCommit(d.ev)
		}
		if c.skipAck != nil && c.skipAck(d.ev) {
			return
		}
		if err := d.msg.Ack(); err != nil {
			c.eventLogger(d).WarnContext(ctx, "ack failed; the redelivery will be dropped as a duplicate", "err", err)
		}
	case failed:
		switch {
		case isPermanent(d.err):
			c.deadLetter(ctx, d, d.err.Error())
		case c.maxDeliver > 0 && d.meta.NumDelivered >= uint64(c.maxDeliver):
			// A nak would not bring it back: JetStream gives up after
			// MaxDeliver deliveries.
			c.deadLetter(ctx, d, fmt.Sprintf("failed on each of %d deliveries, the last: %v", d.meta.NumDelivered, d.err))
		default:
			c.eventLogger(d).WarnContext(ctx, "processing failed; retrying", "deliveries", d.meta.NumDelivered, "err", d.err)
			c.nak(ctx, d)
		}
	default:
		// Unreachable: every path of processTx and processBatch decides.
		c.logger.ErrorContext(ctx, "message left unsettled", "event_id", d.ev.ID, "outcome", d.outcome)
	}
}

func (c *Consumer) nak(ctx context.Context, d *delivery) {
	c.retried.Add(1)
	c.cfg.Observer.Settled(d.ev, OutcomeRetried, d.meta.NumDelivered)
	if err := d.msg.NakWithDelay(nakDelay(c.cfg.NakDelay, d.meta.NumDelivered)); err != nil {
		c.logger.WarnContext(ctx, "nak failed; the message will be redelivered after the ack wait",
			"stream_seq", d.meta.Sequence.Stream, "err", err)
	}
}

// maxNakDelay caps the exponential redelivery delay.
const maxNakDelay = time.Minute

// nakDelay doubles base with every delivery, up to maxNakDelay, so that a
// failing dependency is not hammered while it recovers.
func nakDelay(base time.Duration, delivered uint64) time.Duration {
	d := base
	for i := uint64(1); i < delivered && d < maxNakDelay; i++ {
		d *= 2
	}
	return min(d, maxNakDelay)
}

// deadLetter copies d's message to the DLQ with the reason, then terminates
// it. If the copy fails the message is naked instead: it is never dropped
// uncopied.
func (c *Consumer) deadLetter(ctx context.Context, d *delivery, reason string) {
	reason = strings.Join(strings.Fields(reason), " ") // no line breaks in a header
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	h := nats.Header{}
	for k, v := range d.msg.Headers() {
		// Nats-* headers instructed the server that stored the original
		// (dedup id, expected sequences, TTL, rollup); copied, they would act
		// again on the DLQ stream.
		if !strings.HasPrefix(k, "Nats-") {
			h[k] = slices.Clone(v)
		}
	}
	h.Set(HeaderDLQReason, reason)
	h.Set(HeaderDLQConsumer, c.cfg.Durable)
	h.Set(HeaderDLQStream, d.meta.Stream)
	h.Set(HeaderDLQStreamSeq, strconv.FormatUint(d.meta.Sequence.Stream, 10))
	h.Set(HeaderDLQDeliveries, strconv.FormatUint(d.meta.NumDelivered, 10))
	h.Set(HeaderDLQSubject, d.msg.Subject())
	// One id per stored message: dead-lettering it again (a term that was
	// lost, a crash after the publish) is dropped by the DLQ's dedup.
	h.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s:%d", c.cfg.Durable, d.meta.Sequence.Stream))

	dlq := &nats.Msg{Subject: streams.DLQSubjectPrefix + c.cfg.Durable, Header: h, Data: d.msg.Data()}
	if _, err := c.js.PublishMsg(ctx, dlq); err != nil {
		c.logger.ErrorContext(ctx, "dead-lettering failed; the message will be redelivered",
			"stream_seq", d.meta.Sequence.Stream, "reason", reason, "err", err)
		c.nak(ctx, d)
		return
	}
	c.deadLettered.Add(1)
	c.cfg.Observer.Settled(d.ev, OutcomeDeadLettered, d.meta.NumDelivered)
	c.eventLogger(d).WarnContext(ctx, "message dead-lettered",
		"subject", d.msg.Subject(), "stream_seq", d.meta.Sequence.Stream, "deliveries", d.meta.NumDelivered, "reason", reason)
	if err := d.msg.TermWithReason("dead-lettered"); err != nil {
		c.logger.WarnContext(ctx, "term failed; the redelivery will be dead-lettered again and deduplicated",
			"stream_seq", d.meta.Sequence.Stream, "err", err)
	}
}

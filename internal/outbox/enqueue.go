package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

// Enqueue writes ev to the outbox on the caller's transaction tx; it never
// opens a transaction of its own. The event is published after tx commits,
// and not at all if tx rolls back.
//
// Events are published in outbox id order, which is insert order. Events of
// one aggregate therefore reach the broker in the order they were written
// only if no two transactions write events of that aggregate concurrently: a
// producer enqueues after locking its aggregate's row (e.g. SELECT … FOR
// UPDATE on the order), so that the later transaction inserts after the
// earlier one committed.
//
// The write is traced as a child of ctx's span, and ev.TraceParent is set to
// that span, so that the publish and every consumer continue the trace; an
// ev.TraceParent of another trace than ctx's is kept (see traceEnqueue).
//
// An invalid envelope is refused with an error wrapping event.ErrInvalid.
func Enqueue(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
	var p postgres.Pipeline
	if err := Queue(ctx, &p, ev); err != nil {
		return err
	}
	if err := p.Send(ctx, tx); err != nil {
		return fmt.Errorf("enqueue %s %s: %w", ev.Type, ev.ID, err)
	}
	return nil
}

// Queue is Enqueue whose statement goes on p, to be sent in the caller's
// transaction with the statements around it (Pipeline.Send, or ahead of the
// next statement with Pipeline.Then); the event's span ends when p is sent.
// An invalid envelope is refused at once.
func Queue(ctx context.Context, p *postgres.Pipeline, ev event.Envelope) error {
	ev, subject, end, err := prepare(ctx, ev)
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	p.AfterSend(end)
	return dbsqlc.New().InsertEvent(ctx, p, dbsqlc.InsertEventParams{
		EventID:     ev.ID,
		EventType:   string(ev.Type),
		Source:      ev.Source,
		Subject:     ev.Subject,
		NatsSubject: subject,
		EventTime:   ev.Time,
		Data:        ev.Data,
		Traceparent: ev.TraceParent,
	})
}

// EnqueueBatch writes evs to the outbox on tx with one statement, as Enqueue
// would write each of them in turn: they are published in the order of evs.
// It writes many events in one round trip; a set-based handler that has
// other writes to send queues them together with QueueBatch. If one
// envelope is invalid, none is written, and the error wraps
// event.ErrInvalid.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, evs []event.Envelope) error {
	var p postgres.Pipeline
	if err := QueueBatch(ctx, &p, evs); err != nil {
		return err
	}
	if err := p.Send(ctx, tx); err != nil {
		return fmt.Errorf("enqueue batch of %d events: %w", len(evs), err)
	}
	return nil
}

// QueueBatch is EnqueueBatch whose statement goes on p, to be sent in the
// caller's transaction with the writes queued around it; the events' spans
// end when p is sent. An invalid envelope is refused at once.
func QueueBatch(ctx context.Context, p *postgres.Pipeline, evs []event.Envelope) error {
	if len(evs) == 0 {
		return nil
	}
	arg, end, err := batchArgs(ctx, evs)
	if err != nil {
		return err
	}
	p.AfterSend(end)
	return dbsqlc.New().InsertEvents(ctx, p, arg)
}

// prepare checks ev and starts the span of its write, which end ends with
// the write's error. The span's context becomes ev's trace parent.
func prepare(ctx context.Context, ev event.Envelope) (_ event.Envelope, subject string, end func(error), err error) {
	if err := ev.Validate(); err != nil {
		return ev, "", nil, err
	}
	// The data column is json, which would refuse it at insert time with a
	// less useful error.
	if !json.Valid(ev.Data) {
		return ev, "", nil, fmt.Errorf("%w: %s: data is not JSON", event.ErrInvalid, ev.ID)
	}
	if subject, err = ev.Type.NATSSubject(); err != nil {
		return ev, "", nil, err
	}
	ev, end = traceEnqueue(ctx, ev, subject)
	return ev, subject, end, nil
}

// batchArgs prepares evs as the arguments of one InsertEvents; end ends
// their spans. If one envelope is invalid, it returns its error and no
// span is left open.
func batchArgs(ctx context.Context, evs []event.Envelope) (_ dbsqlc.InsertEventsParams, end func(error), err error) {
	arg := dbsqlc.InsertEventsParams{
		EventIds:     make([]uuid.UUID, len(evs)),
		EventTypes:   make([]string, len(evs)),
		Sources:      make([]string, len(evs)),
		Subjects:     make([]string, len(evs)),
		NatsSubjects: make([]string, len(evs)),
		EventTimes:   make([]time.Time, len(evs)),
		Datas:        make([][]byte, len(evs)),
		Traceparents: make([]string, len(evs)),
	}
	ends := make([]func(error), 0, len(evs))
	end = func(err error) {
		for _, end := range ends {
			end(err)
		}
	}
	for i, ev := range evs {
		ev, subject, endOne, err := prepare(ctx, ev)
		if err != nil {
			err = fmt.Errorf("enqueue batch: %w", err)
			end(err)
			return arg, nil, err
		}
		ends = append(ends, endOne)
		arg.EventIds[i] = ev.ID
		arg.EventTypes[i] = string(ev.Type)
		arg.Sources[i] = ev.Source
		arg.Subjects[i] = ev.Subject
		arg.NatsSubjects[i] = subject
		arg.EventTimes[i] = ev.Time
		arg.Datas[i] = ev.Data
		arg.Traceparents[i] = ev.TraceParent
	}
	return arg, end, nil
}

// Redrive moves the relay back to where it was at since, so that it
// publishes once more every row acknowledged since then, and returns how
// many rows it made unsent. It is the
// answer to a broker that lost acknowledged messages (an ack is not an
// fsync). Republishing is harmless: the stream's duplicate window drops
// what it still remembers, and the consumers' inbox absorbs the rest. Rows
// in partitions already dropped (past the retention) are out of reach; a
// partition is not dropped while a redrive runs. The relay's position is
// found by the order in which positions were recorded, not by the clock
// that stamped them. It does not wait for the relay.
func Redrive(ctx context.Context, pool *pgxpool.Pool, since time.Time) (int64, error) {
	n, err := dbsqlc.New().Redrive(ctx, pool, since)
	if err != nil {
		return 0, fmt.Errorf("redrive outbox since %s: %w", since.Format(time.RFC3339), err)
	}
	return n, nil
}

package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
)

// concurrentOnOneEntity delivers distinct events that share their
// entities to two replicas at once, and holds each handler call after its
// first statement (or as it returns, if it runs fewer) until every event
// stands still: its call held, or waiting for a lock another call holds.
// Calls that read without locking then all have read before any writes,
// which loses an update; calls that lock wait on the first one's lock.
func concurrentOnOneEntity(t *testing.T, s *subject) {
	evs := s.newEvents(t, relatedEvents)
	c := s.cleanRun(t, evs)
	rv := newRendezvous(evs)
	defer rv.release() // a failed check must not leave the calls held
	// On the reference path two workers a replica, a message each, so
	// that the four events are four calls at once; on the batched ones
	// one worker taking two, so that batches run at once.
	workers, batchSize := 2, 1
	if s.mode.batched {
		workers, batchSize = 1, 2
	}
	h := rv.hooks(s, workers, batchSize)
	s.start(t, h)
	s.start(t, h)
	s.deal(t, evs, 2*workers)
	var calls int
	await(t, func() (bool, error) {
		still, n, err := rv.still(t.Context(), s.db)
		calls = n
		return still, err
	}, "conformance: the events never stood still at once (each held after its handler's first statement, or waiting for a lock): %s", rv)
	if calls < 2 {
		t.Fatalf("conformance: the inbox ran the %d events one call at a time, so nothing ran concurrently: %s", len(evs), rv)
	}
	rv.release()
	s.settled(t)
	for i, ev := range evs {
		if n := s.effect(t, ev); n != 1 {
			t.Fatalf("event %d of %d events run concurrently on one entity has %d effects, not 1", i+1, len(evs), n)
		}
	}
	s.requireClean(t, c, "after distinct events on one entity ran concurrently")
}

// deal publishes evs while the durable is paused and pulls pull requests
// wait at the broker, then resumes it: the broker hands the messages to
// the waiting requests in turn (a request that wants more goes to the back
// of the queue), so that the events reach that many workers, not all the
// first one to ask.
func (s *subject) deal(t *testing.T, evs []Event, pulls int) {
	t.Helper()
	ctx := t.Context()
	if _, err := s.env.JS.PauseConsumer(ctx, s.sub.Stream, s.sub.Durable, time.Now().Add(waitFor)); err != nil {
		t.Fatalf("conformance: pause %s: %v", s.sub.Durable, err)
	}
	await(t, func() (bool, error) {
		info, err := s.consumerInfo(ctx)
		if err != nil {
			return false, err
		}
		return info.NumWaiting >= pulls, nil
	}, "conformance: the workers of %s did not all ask for messages", s.sub.Durable)
	for _, ev := range evs[:len(evs)-1] {
		s.publish(t, ev, "")
	}
	if _, err := s.env.JS.ResumeConsumer(ctx, s.sub.Stream, s.sub.Durable); err != nil {
		t.Fatalf("conformance: resume %s: %v", s.sub.Durable, err)
	}
	// A resumed durable delivers at the next pull request (a worker's is
	// renewed every few seconds); a message stored delivers at once, and
	// those before it with it.
	s.publish(t, evs[len(evs)-1], "")
}

// rendezvous holds the handler calls of a set of events until each event
// stands still: committed, in the hand of a worker whose call is held, or
// waiting for a lock. No timer decides: the kit sees the locks a call waits
// for from a connection of its own.
type rendezvous struct {
	events   []uuid.UUID
	released chan struct{}
	once     sync.Once

	mu        sync.Mutex
	workers   map[uuid.UUID][]*worker // the workers each event was handed to
	committed map[uuid.UUID]bool
}

// worker is one inbox worker (one Consume of the durable) and the call it
// runs.
type worker struct {
	held int    // its calls held at the rendezvous
	pid  uint32 // the backend of its call's transaction, once it ran a statement
}

func newRendezvous(evs []Event) *rendezvous {
	rv := &rendezvous{released: make(chan struct{}), workers: map[uuid.UUID][]*worker{}, committed: map[uuid.UUID]bool{}}
	for _, ev := range evs {
		rv.events = append(rv.events, ev.ID)
	}
	return rv
}

func (rv *rendezvous) release() { rv.once.Do(func() { close(rv.released) }) }

// hooks run the subscription's handlers held at the rendezvous, on
// consumers whose workers the rendezvous knows.
func (rv *rendezvous) hooks(s *subject, workers, batchSize int) hooks {
	h := hooks{workers: workers, batchSize: batchSize, js: fetchWatch{JetStream: s.env.JS, rv: rv},
		afterCommit: func(ev Event) {
			rv.mu.Lock()
			defer rv.mu.Unlock()
			rv.committed[ev.ID] = true
		},
		handler: func(ctx context.Context, tx pgx.Tx, ev Event) error {
			return rv.call(ctx, tx, rv.workerOf(ev.ID), func(tx pgx.Tx) error { return s.sub.Handler(ctx, tx, ev) })
		}}
	if s.sub.BatchHandler != nil {
		h.batchHandler = func(ctx context.Context, tx pgx.Tx, evs []Event, writes *postgres.Pipeline) error {
			return rv.call(ctx, tx, rv.workerOf(evs[0].ID), func(tx pgx.Tx) error { return s.sub.BatchHandler(ctx, tx, evs, writes) })
		}
	}
	return h
}

// call runs a handler's call on w, held before its second statement, or
// as it returns if it ran fewer; it records the backend of the call's
// transaction before its first.
func (rv *rendezvous) call(ctx context.Context, tx pgx.Tx, w *worker, run func(pgx.Tx) error) error {
	held := false
	hold := func(ctx context.Context) {
		if !held {
			held = true
			rv.hold(ctx, w)
		}
	}
	err := run(watch(tx, func(ctx context.Context, tx pgx.Tx, n int) error {
		switch n {
		case 1:
			rv.mu.Lock()
			w.pid = tx.Conn().PgConn().PID()
			rv.mu.Unlock()
		case 2:
			hold(ctx)
		}
		return nil
	}))
	if err == nil {
		hold(ctx) // before the commit, which sends a set-based handler's writes
	}
	return err
}

// hold waits, on w, until the rendezvous is released.
func (rv *rendezvous) hold(ctx context.Context, w *worker) {
	rv.mu.Lock()
	w.held++
	rv.mu.Unlock()
	select {
	case <-rv.released:
	case <-ctx.Done():
	}
	rv.mu.Lock()
	w.held--
	rv.mu.Unlock()
}

// workerOf is the worker id was last handed to.
func (rv *rendezvous) workerOf(id uuid.UUID) *worker {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	ws := rv.workers[id]
	if len(ws) == 0 {
		return &worker{} // not one of the kit's deliveries: one it cannot see
	}
	return ws[len(ws)-1]
}

// lockWaiters is the backends among pids that wait for a lock.
const lockWaiters = `SELECT DISTINCT pid FROM pg_locks WHERE NOT granted AND pid = ANY($1)`

// still reports whether every event stands still, and how many workers'
// calls are held or waiting for a lock: the calls that run at once.
func (rv *rendezvous) still(ctx context.Context, db *pgxpool.Pool) (still bool, calls int, err error) {
	rv.mu.Lock()
	var pids []int64
	for _, ws := range rv.workers {
		for _, w := range ws {
			if w.pid != 0 {
				pids = append(pids, int64(w.pid))
			}
		}
	}
	rv.mu.Unlock()
	rows, err := db.Query(ctx, lockWaiters, pids)
	if err != nil {
		return false, 0, fmt.Errorf("read the locks waited for: %w", err)
	}
	waiting, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return false, 0, fmt.Errorf("read the locks waited for: %w", err)
	}
	rv.mu.Lock()
	defer rv.mu.Unlock()
	stopped := map[*worker]bool{}
	for _, ws := range rv.workers {
		for _, w := range ws {
			if w.held > 0 || w.pid != 0 && containsPID(waiting, w.pid) {
				stopped[w] = true
			}
		}
	}
	for _, id := range rv.events {
		if !rv.committed[id] && !anyOf(rv.workers[id], stopped) {
			return false, len(stopped), nil
		}
	}
	return true, len(stopped), nil
}

func containsPID(pids []int32, pid uint32) bool {
	for _, p := range pids {
		if uint32(p) == pid {
			return true
		}
	}
	return false
}

func anyOf(ws []*worker, set map[*worker]bool) bool {
	for _, w := range ws {
		if set[w] {
			return true
		}
	}
	return false
}

// String says where each event is, for a failure.
func (rv *rendezvous) String() string {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	var b strings.Builder
	for i, id := range rv.events {
		ws := rv.workers[id]
		switch {
		case rv.committed[id]:
			fmt.Fprintf(&b, "event %d committed; ", i+1)
		case len(ws) == 0:
			fmt.Fprintf(&b, "event %d handed to no worker; ", i+1)
		default:
			w := ws[len(ws)-1]
			fmt.Fprintf(&b, "event %d with a worker whose call is held %d times, on backend %d; ", i+1, w.held, w.pid)
		}
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// fetchWatch is a JetStream client whose durables' workers tell the
// rendezvous the events they are handed, as they arrive: a batch's later
// events, and those waiting in a worker's hand, count as the worker's
// before its handler sees them.
type fetchWatch struct {
	jetstream.JetStream
	rv *rendezvous
}

func (f fetchWatch) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	c, err := f.JetStream.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return watchedConsumer{Consumer: c, rv: f.rv}, nil
}

type watchedConsumer struct {
	jetstream.Consumer
	rv *rendezvous
}

// Consume is one worker's: each Consume of the inbox is a worker.
func (c watchedConsumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	w := &worker{}
	return c.Consumer.Consume(func(msg jetstream.Msg) {
		if id, err := uuid.Parse(msg.Headers().Get(event.HeaderID)); err == nil {
			c.rv.mu.Lock()
			c.rv.workers[id] = append(c.rv.workers[id], w)
			c.rv.mu.Unlock()
		}
		h(msg)
	}, opts...)
}

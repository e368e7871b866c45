package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/db"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The consumers' settings in the kit: short, so that a redelivery after a
// dropped ack, a retry and a dead letter come within seconds.
const (
	ackWait    = 2 * time.Second
	maxDeliver = 4
	nakDelay   = 50 * time.Millisecond
)

// world is one property run's database, NATS server and service.
type world struct {
	env Env
	// db is the kit's own pool on the service's database, for what it
	// reads: a handler that exhausts the service's pool cannot stall it.
	db       *pgxpool.Pool
	nats     *testenv.NATS
	topology streams.Topology
	subs     []Subscription
	logger   *slog.Logger
}

// newWorld migrates a database for svc, starts a NATS server with the
// saga's streams and svc's durables, and builds svc on them.
func newWorld(t *testing.T, svc Service) *world {
	t.Helper()
	platform, err := db.Migrations(db.Platform)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	schema := postgres.Schema{{Name: db.Platform, FS: platform}}
	if svc.Migrations != nil {
		schema = append(schema, postgres.MigrationSet{Name: svc.Name, FS: svc.Migrations})
	}
	database := testenv.NewDatabase(t, schema)
	kitDB, err := postgres.Connect(t.Context(), database.URL)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	t.Cleanup(kitDB.Close)
	n := testenv.NewNATS(t)
	w := &world{
		db:     kitDB,
		env:    Env{Pool: database.Pool, JS: n.JetStream(t)},
		nats:   n,
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	w.subs = svc.New(w.env)
	if len(w.subs) == 0 {
		t.Fatalf("conformance: Service.New returned no subscriptions")
	}
	w.topology = streams.Saga(streams.Config{
		Storage: jetstream.MemoryStorage, AckWait: ackWait, MaxDeliver: maxDeliver,
	})
	for i := range w.subs {
		if err := w.addConsumer(svc.Name, &w.subs[i]); err != nil {
			t.Fatalf("conformance: %v", err)
		}
	}
	if err := streams.Provision(t.Context(), w.env.JS, w.topology); err != nil {
		t.Fatalf("conformance: provision the streams: %v", err)
	}
	return w
}

// addConsumer adds sub's durable to the topology unless it is there, and
// gives sub the stream of a durable that is.
func (w *world) addConsumer(service string, sub *Subscription) error {
	switch {
	case sub.wiring != nil:
		return sub.wiring
	case sub.Durable == "":
		return errors.New("a subscription needs its Durable")
	case sub.Handler == nil || sub.NewEvent == nil || sub.Effect == nil:
		return fmt.Errorf("subscription %s needs Handler, NewEvent and Effect", sub.Durable)
	}
	if c, ok := w.topology.Consumer(sub.Durable); ok {
		if sub.Stream != "" && c.Stream != sub.Stream {
			return fmt.Errorf("durable %s is on stream %s in the topology, not %s", sub.Durable, c.Stream, sub.Stream)
		}
		sub.Stream = c.Stream
		return nil
	}
	if sub.Stream == "" || len(sub.Subjects) == 0 {
		return fmt.Errorf("durable %s is not in the saga's topology: name its Stream and Subjects", sub.Durable)
	}
	w.topology.Consumers = append(w.topology.Consumers, streams.Consumer{
		Stream: sub.Stream, Durable: sub.Durable, Service: service, FilterSubjects: sub.Subjects,
	})
	return nil
}

// requireEverySubscription fails the test unless w's subscriptions test
// every durable the saga's topology gives the service, and every event
// type each durable consumes: a Subscription per type, or one whose
// NewEvent makes the durable's types in turn (a call each).
func (w *world) requireEverySubscription(t *testing.T, service string) {
	t.Helper()
	made := map[string]bool{} // durable and subject
	for i := range w.subs {
		s := w.subject(t, i)
		// Calls enough for a NewEvent that makes the durable's types in
		// turn.
		c, _ := w.topology.Consumer(s.sub.Durable)
		for range max(1, len(c.FilterSubjects)) {
			made[s.sub.Durable+" "+mustSubject(t, s.newEvent(t))] = true
		}
	}
	for _, c := range w.topology.Consumers {
		i := slices.IndexFunc(w.subs, func(sub Subscription) bool { return sub.Durable == c.Durable })
		if i < 0 {
			if c.Service == service {
				t.Errorf("the service's durable %s (internal/streams) has no Subscription: each subscription its wiring runs must be tested", c.Durable)
			}
			continue
		}
		for _, subj := range c.FilterSubjects {
			if !strings.HasSuffix(subj, ">") && !made[c.Durable+" "+subj] {
				t.Errorf("durable %s consumes %s, but no Subscription of it makes such an event: give each event type a durable consumes a Subscription of its own, whose NewEvent makes that type", c.Durable, subj)
			}
		}
	}
}

// subject is one subscription of a world under test, in a mode.
type subject struct {
	*world
	sub  Subscription
	mode mode
	// lastSeq is the stream sequence of the last message the kit
	// published to the durable's stream.
	lastSeq atomic.Uint64
}

func (w *world) subject(t *testing.T, i int) *subject {
	t.Helper()
	if i >= len(w.subs) {
		t.Fatalf("conformance: Service.New returned %d subscriptions, then %d", i+1, len(w.subs))
	}
	return &subject{world: w, sub: w.subs[i], mode: reference}
}

// hooks change how a consumer runs the subscription's handlers.
type hooks struct {
	handler      Handler
	batchHandler BatchHandler
	afterCommit  func(Event)
	workers      int
	batchSize    int
	js           jetstream.JetStream
}

// consumer is a running inbox consumer of the subscription.
type consumer struct {
	*inbox.Consumer
	stop func() error
}

// start runs an inbox consumer of the subscription, in the subject's mode,
// until stop (or the end of the test).
func (s *subject) start(t *testing.T, h hooks) *consumer {
	t.Helper()
	cfg := inbox.Config{
		Stream: s.sub.Stream, Durable: s.sub.Durable,
		Batched: s.mode.batched, Workers: h.workers, BatchSize: h.batchSize,
		NakDelay: nakDelay, Topology: &s.topology,
	}
	if h.afterCommit != nil {
		cfg.Observer = afterCommit(h.afterCommit)
	}
	if s.mode.setBased {
		cfg.BatchHandler = s.sub.BatchHandler
		if h.batchHandler != nil {
			cfg.BatchHandler = h.batchHandler
		}
	}
	handler := s.sub.Handler
	if h.handler != nil {
		handler = h.handler
	}
	js := h.js
	if js == nil {
		js = s.env.JS
	}
	// The inbox runs a handler under a context that is never canceled, to
	// finish what it started on a graceful stop; a broken handler stuck on
	// a connection of its own would then hold the test forever. Stopping
	// the consumer cancels its handlers' contexts after the grace below.
	kill, killed := context.WithCancel(context.Background())
	handler, cfg.BatchHandler = killable(kill, handler), killableBatch(kill, cfg.BatchHandler)
	c := inbox.New(s.env.Pool, js, cfg, handler, s.logger)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			grace := time.AfterFunc(stopGrace, killed)
			defer grace.Stop()
			defer killed()
			select {
			case err = <-done:
			case <-time.After(waitFor):
				err = fmt.Errorf("the consumer did not stop within %s", waitFor)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return &consumer{Consumer: c, stop: stop}
}

// stopGrace is how long a stopping consumer's handlers may run on.
const stopGrace = 5 * time.Second

// killable runs h under a context that is also canceled with kill.
func killable(kill context.Context, h Handler) Handler {
	return func(ctx context.Context, tx pgx.Tx, ev Event) error {
		ctx, cancel := context.WithCancel(ctx)
		defer context.AfterFunc(kill, cancel)()
		defer cancel()
		return h(ctx, tx, ev)
	}
}

// killableBatch is killable for a BatchHandler; nil stays nil.
func killableBatch(kill context.Context, h BatchHandler) BatchHandler {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx, evs []Event, writes *postgres.Pipeline) error {
		ctx, cancel := context.WithCancel(ctx)
		defer context.AfterFunc(kill, cancel)()
		defer cancel()
		return h(ctx, tx, evs, writes)
	}
}

// newEvent is a new event of the subscription.
func (s *subject) newEvent(t *testing.T) Event {
	t.Helper()
	ev := s.sub.NewEvent(t, s.env)
	if err := ev.Validate(); err != nil {
		t.Fatalf("conformance: NewEvent returned an invalid event: %v", err)
	}
	return ev
}

// publish publishes ev as a new message (a fresh Nats-Msg-Id, so that the
// broker does not drop a second copy: only the inbox may) on subject, or
// on its type's subject when subject is "".
func (s *subject) publish(t *testing.T, ev Event, subj string) {
	t.Helper()
	msg, err := ev.Msg()
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
	if subj != "" {
		msg.Subject = subj
	}
	ack, err := s.env.JS.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatalf("conformance: publish %s: %v", ev.Type, err)
	}
	for seq := s.lastSeq.Load(); seq < ack.Sequence && !s.lastSeq.CompareAndSwap(seq, ack.Sequence); {
		seq = s.lastSeq.Load()
	}
}

// effect is Effect of ev.
func (s *subject) effect(t *testing.T, ev Event) int {
	t.Helper()
	n, err := s.sub.Effect(t.Context(), s.db, ev)
	if err != nil {
		t.Fatalf("conformance: Effect: %v", err)
	}
	return n
}

// settled waits until the durable has had every message the kit published
// delivered, and acked or terminated.
func (s *subject) settled(t *testing.T) {
	t.Helper()
	await(t, func() (bool, error) {
		info, err := s.consumerInfo(t.Context())
		if err != nil {
			return false, err
		}
		return info.Delivered.Stream >= s.lastSeq.Load() && info.NumPending == 0 && info.NumAckPending == 0, nil
	}, "the durable %s did not settle every message: acked or dead-lettered", s.sub.Durable)
}

// consumerInfo is the durable's state on the server.
func (s *subject) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	cons, err := s.env.JS.Consumer(ctx, s.sub.Stream, s.sub.Durable)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// deadLetters returns the DLQ's messages of the subscription's durable.
func (s *subject) deadLetters(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	st, err := s.env.JS.Stream(ctx, streams.DLQ)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		msg, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("conformance: %v", err)
		}
		if msg.Subject == streams.DLQSubjectPrefix+s.sub.Durable {
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

// deadLetterOf returns the DLQ message of ev, or nil.
func (s *subject) deadLetterOf(t *testing.T, ev Event) *jetstream.RawStreamMsg {
	t.Helper()
	i := slices.IndexFunc(s.deadLetters(t), func(m *jetstream.RawStreamMsg) bool {
		return m.Header.Get(event.HeaderID) == ev.ID.String()
	})
	if i < 0 {
		return nil
	}
	return s.deadLetters(t)[i]
}

// emitted returns every message on the server, in every stream (the
// saga's, the DLQ, a key-value bucket's, one the service made), but those
// of the events the kit published (inputs) and those in a stream before
// since's mark of it.
func (s *subject) emitted(t *testing.T, inputs map[string]bool, since map[string]uint64) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	var out []*jetstream.RawStreamMsg
	for name, last := range s.streamMarks(t) {
		st, err := s.env.JS.Stream(ctx, name)
		if err != nil {
			t.Fatalf("conformance: %v", err)
		}
		for seq := since[name] + 1; seq <= last; seq++ {
			msg, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // deleted, or a key-value entry replaced since
			}
			if err != nil {
				t.Fatalf("conformance: %v", err)
			}
			if !inputs[msg.Header.Get(event.HeaderID)] {
				out = append(out, msg)
			}
		}
	}
	return out
}

// streamMarks returns the last sequence of every stream on the server.
func (s *subject) streamMarks(t *testing.T) map[string]uint64 {
	t.Helper()
	marks := map[string]uint64{}
	list := s.env.JS.ListStreams(t.Context())
	for info := range list.Info() {
		marks[info.Config.Name] = info.State.LastSeq
	}
	if err := list.Err(); err != nil {
		t.Fatalf("conformance: list the streams: %v", err)
	}
	return marks
}

// conn is a NATS connection of its own, closed at the end of the test.
func (s *subject) conn(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := s.nats.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("conformance: %v", err)
	}
	return nc, js
}

// afterCommit is an inbox.Observer that calls f for each processed event:
// the inbox tells its Observer after the commit and before the ack.
type afterCommit func(Event)

func (afterCommit) Handle(ctx context.Context, _ Event) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (afterCommit) HandleBatch(ctx context.Context, _ []Event) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (afterCommit) Transaction(int, time.Duration, error) {}

func (f afterCommit) Settled(ev Event, outcome inbox.Outcome, _ uint64) {
	if outcome == inbox.OutcomeProcessed {
		f(ev)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/onceflow/onceflow/internal/streams"
)

// publishWatch watches, as a plain NATS subscriber, every publish on the
// saga's subjects and the replies to them: how often each event was
// published (a relay publishes an event again when it could not mark it
// sent), and the atomic batches the relays publish (ADR-50: messages with a
// Nats-Batch-Id, the last with Nats-Batch-Commit, whose reply is the
// batch's ack). It sees the relays from outside, as a tap on the wire would,
// and changes nothing.
//
// On a cluster it subscribes on every node, so that killing one loses
// none of what the others see; a publish is counted once per node that saw
// it, and the most any node saw is the count.
type publishWatch struct {
	mu        sync.Mutex
	published []map[string]int // per node: publishes by Nats-Msg-Id
	batches   map[string]*watchedBatch
	byReply   map[string]*watchedBatch // by the commit's reply subject
	// early holds the acks that arrived before their commit message, by
	// reply subject. Each subscription has a delivery goroutine of its own,
	// and the one of the saga's subjects, which carry every event, can run
	// far behind the one of the replies on a loaded machine: in CI a run saw
	// no batch refused because every refusal came before its commit.
	early map[string]batchAck
	// ackedFirst counts the batches whose ack came before their commit.
	ackedFirst int
}

// batchAck is what an ack said of a batch.
type batchAck struct {
	stored  bool
	errCode int
}

// watchedBatch is one atomic batch as the wire showed it.
type watchedBatch struct {
	id        string
	stream    string
	firstSeen time.Time
	committed bool // its commit message went by
	acked     bool // the stream acknowledged it
	errCode   int  // the error its ack carried, 0 if none or not yet
}

// batchOutcomes counts atomic batches by what their acks said.
type batchOutcomes struct {
	seen, stored, refusedDuplicate, failed int
	ackedFirst                             int // seen before their commit
}

// newPublishWatch subscribes on each of urls and unsubscribes when the test
// ends.
func newPublishWatch(t *testing.T, urls []string, opts ...nats.Option) *publishWatch {
	t.Helper()
	w := &publishWatch{batches: map[string]*watchedBatch{}, byReply: map[string]*watchedBatch{}, early: map[string]batchAck{}}
	for i, url := range urls {
		w.published = append(w.published, map[string]int{})
		nc, err := nats.Connect(url, append(slices.Clone(opts), nats.Name(fmt.Sprintf("e2e-watch-%d", i)), nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond), nats.DontRandomize())...)
		if err != nil {
			t.Fatalf("e2e: watch %s: %v", url, err)
		}
		t.Cleanup(nc.Close)
		for _, subject := range []string{"orders.>", "payments.>", "inventory.>"} {
			sub, err := nc.Subscribe(subject, func(m *nats.Msg) { w.publish(i, m) })
			if err == nil {
				err = sub.SetPendingLimits(-1, -1)
			}
			if err != nil {
				t.Fatalf("e2e: watch %s: %v", subject, err)
			}
		}
		// Publish acks are replies to each publisher's own inbox prefix.
		for _, prefix := range []string{nats.InboxPrefix, streams.InboxPrefix("order") + ".", streams.InboxPrefix("payment") + ".",
			streams.InboxPrefix("inventory") + ".", streams.InboxPrefix("notify") + "."} {
			sub, err := nc.Subscribe(prefix+">", w.reply)
			if err == nil {
				err = sub.SetPendingLimits(-1, -1)
			}
			if err != nil {
				t.Fatalf("e2e: watch replies: %v", err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("e2e: watch: %v", err)
		}
	}
	return w
}

func (w *publishWatch) publish(node int, m *nats.Msg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" && m.Header.Get(copyHeader) == "" {
		w.published[node][id]++
	}
	batchID := m.Header.Get(jetstreamext.BatchIDHeader)
	if batchID == "" {
		return
	}
	b := w.batches[batchID]
	if b == nil {
		b = &watchedBatch{id: batchID, stream: streamOf(m.Subject), firstSeen: time.Now()}
		w.batches[batchID] = b
	}
	if m.Header.Get(jetstreamext.BatchCommitHeader) != "" && m.Reply != "" {
		b.committed = true
		w.byReply[m.Reply] = b
		if ack, ok := w.early[m.Reply]; ok {
			delete(w.early, m.Reply)
			w.ackedFirst++
			b.settle(ack)
		}
	}
}

func (w *publishWatch) reply(m *nats.Msg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var msg struct {
		Stream string `json:"stream"`
		Error  *struct {
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &msg); err != nil {
		return // not an ack: an empty status message (no responders) or the like
	}
	var ack batchAck
	switch {
	case msg.Error != nil:
		ack.errCode = msg.Error.ErrCode
	case msg.Stream != "":
		ack.stored = true
	default:
		return
	}
	b := w.byReply[m.Subject]
	if b == nil {
		// Its commit is still on the way, or it is the ack of a message
		// published on its own: kept, as the relays publish a few
		// thousand messages in a scenario.
		if _, ok := w.early[m.Subject]; !ok {
			w.early[m.Subject] = ack
		}
		return
	}
	b.settle(ack)
}

// settle records the batch's first ack; every node delivers it.
func (b *watchedBatch) settle(ack batchAck) {
	if b.acked || b.errCode != 0 {
		return
	}
	b.acked, b.errCode = ack.stored, ack.errCode
}

// openBatches returns the ids of the atomic batches to stream under way:
// first seen on the wire after since, not yet acknowledged nor refused. (A
// batch cut off by an earlier kill stays unacknowledged for good.)
func (w *publishWatch) openBatches(stream string, since time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var open []string
	for id, b := range w.batches {
		if b.stream == stream && b.firstSeen.After(since) && !b.acked && b.errCode == 0 {
			open = append(open, id)
		}
	}
	return open
}

// neverAcked counts the batches among ids that no stream acknowledged: a
// kill that found them under way cut them off.
func (w *publishWatch) neverAcked(ids []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, id := range ids {
		if b := w.batches[id]; b != nil && !b.acked {
			n++
		}
	}
	return n
}

// outcomes counts the atomic batches by their acks.
func (w *publishWatch) outcomes() batchOutcomes {
	w.mu.Lock()
	defer w.mu.Unlock()
	o := batchOutcomes{ackedFirst: w.ackedFirst}
	for _, b := range w.batches {
		o.seen++
		switch {
		case b.acked:
			o.stored++
		case b.errCode == int(jetstreamext.JSErrCodeBatchPublishDuplicateMsgID):
			o.refusedDuplicate++
		case b.errCode != 0:
			o.failed++
		}
	}
	return o
}

// republished counts the events published more than once.
func (w *publishWatch) republished() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	most := map[string]int{}
	for _, node := range w.published {
		for id, n := range node {
			most[id] = max(most[id], n)
		}
	}
	r := 0
	for _, n := range most {
		if n > 1 {
			r++
		}
	}
	return r
}

// storedTwice reads the saga's streams and returns the event ids stored
// more than once: an event published twice downstream, which the broker's
// duplicate window must prevent whatever the relays retried.
func (sys *system) storedTwice(ctx context.Context) ([]string, error) {
	var twice []string
	for _, name := range sagaStreams {
		var ids []string
		var err error
		// On a cluster a consumer just created can answer no responders
		// for a moment, or for good where it was placed badly: read again
		// through a new one.
		for attempt := 0; attempt < 5; attempt++ {
			if ids, err = sys.streamIDs(ctx, name); err == nil || !sleepCtx(ctx, time.Second) {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				twice = append(twice, name+":"+id)
			}
			seen[id] = true
		}
	}
	return twice, nil
}

// streamIDs returns the Nats-Msg-Id of every message of stream, in order.
func (sys *system) streamIDs(ctx context.Context, name string) ([]string, error) {
	s, err := sys.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	cons, err := sys.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	var ids []string
	for uint64(len(ids)) < info.State.Msgs {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", name, err)
		}
		for msg := range batch.Messages() {
			ids = append(ids, msg.Headers().Get(jetstream.MsgIDHeader))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("read stream %s: %w", name, err)
		}
	}
	return ids, nil
}

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// sleepCtx waits for d or until ctx is done, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jitter is a duration between lo and hi.
func jitter(lo, hi time.Duration) time.Duration { return lo + rand.N(hi-lo+1) }

// ---- kill -9 ----------------------------------------------------------------

// chaos kills a random running service instance every 1 to 2.5 seconds
// until enough returns true; the supervisors restart them.
func (sys *system) chaos(ctx context.Context, enough func() bool) error {
	for !enough() {
		if !sleepCtx(ctx, jitter(time.Second, 2500*time.Millisecond)) {
			return fmt.Errorf("chaos: %w", ctx.Err())
		}
		s := sys.services[rand.IntN(len(sys.services))]
		if s.kill(ctx) {
			sys.faults.add("kill_9:"+s.kind, 1)
		}
	}
	return nil
}

// selfKills counts the instances' deaths by the fault hook so far.
func (sys *system) selfKills() int {
	n := 0
	for _, s := range sys.services {
		s.mu.Lock()
		n += s.selfKills
		s.mu.Unlock()
	}
	return n
}

func mustUUIDv7() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// ---- duplicate storm --------------------------------------------------------

// copyHeader marks the messages a duplicator published, so that it does not
// copy its own copies.
const copyHeader = "E2e-Copy"

// duplicator re-publishes every event of the saga's streams copies times,
// each copy with a fresh Nats-Msg-Id so that the broker's duplicate window
// does not drop it: only the consumers' inboxes can.
type duplicator struct {
	js     jetstream.JetStream
	copies int
	// published counts the copies; deliveries the copies times the durables
	// that receive each (the duplicates the inboxes must drop).
	published  atomic.Int64
	deliveries atomic.Int64

	mu  sync.Mutex
	pos map[string]uint64 // the last stream sequence read, per stream
}

func newDuplicator(js jetstream.JetStream, copies int) *duplicator {
	return &duplicator{js: js, copies: copies, pos: map[string]uint64{}}
}

var sagaStreams = []string{streams.Orders, streams.Payments, streams.Inventory}

// run copies until ctx is done.
func (dup *duplicator) run(ctx context.Context) error {
	errc := make(chan error, len(sagaStreams))
	for _, stream := range sagaStreams {
		go func() { errc <- dup.copyStream(ctx, stream) }()
	}
	var errs []error
	for range sagaStreams {
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (dup *duplicator) copyStream(ctx context.Context, stream string) error {
	cons, err := dup.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("duplicator on %s: %w", stream, err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("duplicator fetch from %s: %w", stream, err)
		}
		for msg := range batch.Messages() {
			if err := dup.copyMsg(ctx, stream, msg); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("duplicator fetch from %s: %w", stream, err)
		}
	}
	return ctx.Err()
}

func (dup *duplicator) copyMsg(ctx context.Context, stream string, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	if msg.Headers().Get(copyHeader) == "" {
		receivers := int64(len(durablesOf(stream, msg.Subject())))
		for i := range dup.copies {
			h := nats.Header{}
			for k, v := range msg.Headers() {
				// Nats-* headers instructed the server that stored the
				// original (its id, the atomic batch a relay published it
				// in); copied, they would act again.
				if !strings.HasPrefix(k, "Nats-") {
					h[k] = v
				}
			}
			id := fmt.Sprintf("%s-copy-%d", msg.Headers().Get(event.HeaderID), i+1)
			h.Set(jetstream.MsgIDHeader, id)
			h.Set(copyHeader, fmt.Sprint(i+1))
			if _, err := dup.js.PublishMsgAsync(&nats.Msg{Subject: msg.Subject(), Header: h, Data: msg.Data()}); err != nil {
				return fmt.Errorf("publish copy %s: %w", id, err)
			}
			dup.published.Add(1)
			dup.deliveries.Add(receivers)
		}
		select {
		case <-dup.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	dup.mu.Lock()
	dup.pos[stream] = meta.Sequence.Stream
	dup.mu.Unlock()
	return nil
}

// caughtUp reports whether every message of the streams has been read,
// copies included.
func (dup *duplicator) caughtUp(ctx context.Context) (bool, error) {
	for _, name := range sagaStreams {
		s, err := dup.js.Stream(ctx, name)
		if err != nil {
			return false, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return false, err
		}
		dup.mu.Lock()
		pos := dup.pos[name]
		dup.mu.Unlock()
		if pos < info.State.LastSeq {
			return false, nil
		}
	}
	return true, nil
}

// durablesOf returns the durables of the saga that receive a message on
// subject of stream.
func durablesOf(stream, subject string) []string {
	var ds []string
	for _, c := range streams.Saga(streams.Config{}).Consumers {
		if c.Stream != stream {
			continue
		}
		for _, f := range c.FilterSubjects {
			if subjectMatches(f, subject) {
				ds = append(ds, c.Durable)
				break
			}
		}
	}
	return ds
}

// subjectMatches applies NATS wildcards: "*" one token, ">" the rest.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// ---- poison -----------------------------------------------------------------

// poisonMsg is a message that no consumer can process.
type poisonMsg struct {
	name    string
	subject string
	header  nats.Header
	data    []byte
	// reason is a part of the DLQ reason expected.
	reason string
}

// poisonMessages are malformed, unknown, invalid, ancient and orphaned
// messages, on every stream.
func poisonMessages() []poisonMsg {
	ce := func(typ event.Type, at time.Time, subject string) nats.Header {
		h := nats.Header{}
		h.Set(event.HeaderSpecVersion, "1.0")
		h.Set(event.HeaderID, mustUUIDv7().String())
		h.Set(event.HeaderType, string(typ))
		// Not its type's owner: the auditor counts an owner's events as
		// published, and these are no saga's. The inbox's owner check
		// dead-letters those that decode (their faults further in are
		// the inbox's and the handlers' own tests').
		h.Set(event.HeaderSource, "e2e-poison")
		h.Set(event.HeaderSubject, subject)
		h.Set(event.HeaderTime, at.UTC().Format(time.RFC3339Nano))
		h.Set(event.HeaderContentType, "application/json")
		return h
	}
	orphan := mustUUIDv7().String()
	const notOwner = `ce-source "e2e-poison" is not`
	noSpec := ce(event.PaymentRejected, time.Now(), orphan)
	noSpec.Del(event.HeaderSpecVersion)
	return []poisonMsg{
		{name: "garbage", subject: "orders.placed.v1", data: []byte("\x00\xff not an event"), reason: "specversion"},
		{name: "unknown type", subject: "orders.placed.v1", header: ce("onceflow.order.exploded.v1", time.Now(), orphan),
			data: []byte(`{}`), reason: "unknown type"},
		{name: "unknown subject", subject: "orders.exploded.v1", header: ce("onceflow.order.exploded.v1", time.Now(), orphan),
			data: []byte(`{}`), reason: "unknown type"},
		{name: "bad payload", subject: "orders.placed.v1", header: ce(event.OrderPlaced, time.Now(), orphan),
			data: []byte(`{"order_id":"not-a-uuid","customer_id":"x"}`), reason: notOwner},
		{name: "negative quantity", subject: "orders.placed.v1", header: ce(event.OrderPlaced, time.Now(), orphan),
			data:   fmt.Appendf(nil, `{"order_id":%q,"customer_id":"ghost","lines":[{"sku":"sku-00","quantity":-1,"unit_price_cents":1}],"total_cents":1}`, orphan),
			reason: notOwner},
		// Valid but older than the inbox retention: its inbox row may be gone,
		// so it must not be processed blindly.
		{name: "ancient", subject: "orders.placed.v1", header: ce(event.OrderPlaced, time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), orphan),
			data:   fmt.Appendf(nil, `{"order_id":%q,"customer_id":"ghost","lines":[{"sku":"sku-00","quantity":1,"unit_price_cents":1}],"total_cents":1}`, orphan),
			reason: notOwner},
		{name: "trailing data", subject: "payments.debited.v1", header: ce(event.PaymentDebited, time.Now(), orphan),
			data: []byte(`{}{}`), reason: notOwner},
		{name: "orphan", subject: "inventory.rejected.v1", header: ce(event.StockRejected, time.Now(), orphan),
			data: fmt.Appendf(nil, `{"order_id":%q,"customer_id":"ghost","amount_cents":100,"reason":"forged"}`, orphan), reason: notOwner},
		{name: "huge", subject: "inventory.reserved.v1", header: ce(event.StockReserved, time.Now(), orphan),
			data: bytes.Repeat([]byte("["), 200_000), reason: notOwner},
		{name: "no specversion", subject: "payments.rejected.v1", header: noSpec, data: []byte(`{}`), reason: "specversion"},
	}
}

// publishPoison publishes the poison messages, spread over the load, and
// returns how many DLQ entries they must cause: one per durable receiving
// each.
func (sys *system) publishPoison(ctx context.Context, d *driver, poison []poisonMsg) (int64, error) {
	var dlq int64
	for i, p := range poison {
		if err := d.awaitOrders(ctx, 40*(i+1)); err != nil {
			return 0, err
		}
		h := p.header
		if h == nil {
			h = nats.Header{}
		}
		h.Set(jetstream.MsgIDHeader, "poison-"+mustUUIDv7().String())
		stream := streamOf(p.subject)
		if _, err := sys.js.PublishMsg(ctx, &nats.Msg{Subject: p.subject, Header: h, Data: p.data}); err != nil {
			return 0, fmt.Errorf("publish poison %q: %w", p.name, err)
		}
		dlq += int64(len(durablesOf(stream, p.subject)))
		sys.faults.add("poison", 1)
	}
	return dlq, nil
}

func streamOf(subject string) string {
	switch strings.SplitN(subject, ".", 2)[0] {
	case "orders":
		return streams.Orders
	case "payments":
		return streams.Payments
	default:
		return streams.Inventory
	}
}

// dlqReasons reads the DLQ stream: the reason of every entry, by consumer.
func (sys *system) dlqReasons(ctx context.Context) (map[string][]string, error) {
	cons, err := sys.js.OrderedConsumer(ctx, streams.DLQ, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	s, err := sys.js.Stream(ctx, streams.DLQ)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	reasons := map[string][]string{}
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		for msg := range batch.Messages() {
			read++
			c := msg.Headers().Get("Onceflow-Dlq-Consumer")
			reasons[c] = append(reasons[c], msg.Headers().Get("Onceflow-Dlq-Reason"))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
	}
	return reasons, nil
}

// ---- toxiproxy --------------------------------------------------------------

// toxics is an in-process toxiproxy: TCP proxies whose links can be given
// latency, stalls and resets.
type toxics struct {
	server *toxiproxy.ApiServer
}

func newToxics() *toxics {
	return &toxics{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// proxy starts a proxy to upstream on a free port; it stops with the test.
func (x *toxics) proxy(t *testing.T, name, upstream string) *toxicProxy {
	t.Helper()
	p := toxiproxy.NewProxy(x.server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("e2e: toxiproxy %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return &toxicProxy{p: p}
}

type toxicProxy struct{ p *toxiproxy.Proxy }

func (p *toxicProxy) addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// toxic is one toxic: its type ("latency", "timeout", "reset_peer", …), the
// stream it acts on ("upstream": client to server, or "downstream"), the
// share of connections it affects, and its attributes.
type toxic struct {
	kind       string
	stream     string
	toxicity   float32
	attributes string // JSON
}

// apply adds the toxic for d, then removes it. It returns early, with the
// toxic removed, when ctx is done.
func (p *toxicProxy) apply(ctx context.Context, tx toxic, d time.Duration) error {
	name := fmt.Sprintf("%s_%s_%d", tx.kind, tx.stream, rand.Int64())
	spec := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":%g,"attributes":%s}`,
		name, tx.kind, tx.stream, tx.toxicity, tx.attributes)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		return fmt.Errorf("add toxic %s: %w", spec, err)
	}
	sleepCtx(ctx, d)
	if err := p.p.Toxics.RemoveToxic(context.WithoutCancel(ctx), name); err != nil {
		return fmt.Errorf("remove toxic %s: %w", name, err)
	}
	return nil
}

// ---- ambiguous commits ------------------------------------------------------

// commitCutter is a TCP proxy in front of PostgreSQL. While armed, it cuts
// a client off the moment the client sends COMMIT, and only then passes the
// COMMIT on to the server, which commits: the client sees its connection
// break and cannot know the outcome. That is the ambiguous commit a network
// failure causes at the worst moment. A COMMIT comes as a simple query, or
// in a pipeline of the extended protocol (with the writes queued for it),
// which the server runs when the pipeline's Sync arrives: then the cut is
// at the Sync.
type commitCutter struct {
	ln       net.Listener
	upstream string
	armed    atomic.Int64 // cuts left to make
	cuts     atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newCommitCutter(t *testing.T, upstream string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("e2e: commit cutter: %v", err)
	}
	c := &commitCutter{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	c.wg.Go(c.serve)
	t.Cleanup(c.close)
	return c
}

func (c *commitCutter) addr() string { return c.ln.Addr().String() }

// arm makes the cutter cut the next n commits.
func (c *commitCutter) arm(n int) { c.armed.Add(int64(n)) }

func (c *commitCutter) close() {
	c.ln.Close()
	c.mu.Lock()
	for conn := range c.conns {
		conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *commitCutter) track(conns ...net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range conns {
		c.conns[conn] = struct{}{}
	}
}

func (c *commitCutter) serve() {
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", c.upstream)
		if err != nil {
			client.Close()
			continue
		}
		c.track(client, server)
		c.wg.Go(func() {
			// Server to client. After a cut the client is gone: the server's
			// answer to the COMMIT fails to be written, and only then is the
			// server's connection closed, so the server has committed first.
			_, _ = io.Copy(client, server)
			client.Close()
			server.Close()
		})
		c.wg.Go(func() {
			if !c.forward(client, server) {
				server.Close()
			}
		})
	}
}

// forward copies the client's messages to the server, cutting at a COMMIT
// when armed. It reports whether it cut.
func (c *commitCutter) forward(client, server net.Conn) (cut bool) {
	// The startup phase: untyped messages (an SSLRequest, answered by one
	// byte, then the StartupMessage).
	for {
		msg, err := readMessage(client, false)
		if err != nil {
			return false
		}
		if _, err := server.Write(msg); err != nil {
			return false
		}
		if len(msg) == 8 && binary.BigEndian.Uint32(msg[4:]) == 80877103 { // SSLRequest
			continue
		}
		break
	}
	var (
		commits = map[string]bool{} // prepared statements that are a COMMIT, by name ("" unnamed)
		pending bool                // a COMMIT is bound and runs at the next Sync
	)
	for {
		msg, err := readMessage(client, true)
		if err != nil {
			return false
		}
		cut := false
		switch msg[0] {
		case 'Q': // a simple query
			cut = isCommit(cstrings(msg[5:], 1)[0]) && c.take()
		case 'P': // Parse: statement name, query
			f := cstrings(msg[5:], 2)
			commits[f[0]] = isCommit(f[1])
		case 'B': // Bind: portal, statement name
			pending = pending || commits[cstrings(msg[5:], 2)[1]]
		case 'S': // Sync: the pipeline runs
			cut = pending && c.take()
			pending = false
		}
		if cut {
			client.Close()
			_, _ = server.Write(msg)
			c.cuts.Add(1)
			return true
		}
		if _, err := server.Write(msg); err != nil {
			return false
		}
	}
}

func isCommit(query string) bool {
	return strings.EqualFold(strings.TrimRight(query, "; "), "commit")
}

// cstrings returns the first n NUL-terminated strings of b (empty ones
// when b holds fewer).
func cstrings(b []byte, n int) []string {
	out := make([]string, n)
	for i := range out {
		s, rest, _ := bytes.Cut(b, []byte{0})
		out[i], b = string(s), rest
	}
	return out
}

// take uses up one armed cut, if any is left.
func (c *commitCutter) take() bool {
	for {
		n := c.armed.Load()
		if n <= 0 {
			return false
		}
		if c.armed.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// readMessage reads one protocol message: a type byte (if typed) and a
// length that counts itself.
func readMessage(r io.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	buf := make([]byte, head)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(buf[head-4:]))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("bad message length %d", n)
	}
	msg := make([]byte, head+n-4)
	copy(msg, buf)
	if _, err := io.ReadFull(r, msg[head:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// ---- severed and starved connections ---------------------------------------

// relayApplicationName is the application_name of the outbox relay's LISTEN
// session.
const relayApplicationName = "onceflow-outbox-relay"

// listenSessions counts the relays' LISTEN sessions, per database.
func (sys *system) listenSessions(ctx context.Context) (map[string]int, error) {
	rows, err := sys.pg.admin.Query(ctx, `
		SELECT datname, count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = ANY($2) GROUP BY datname`,
		relayApplicationName, sys.databases())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	n := map[string]int{}
	for rows.Next() {
		var db string
		var c int
		if err := rows.Scan(&db, &c); err != nil {
			return nil, err
		}
		n[db] = c
	}
	return n, rows.Err()
}

// severListens kills the relays' LISTEN sessions in every database, then
// waits until each relay listens again.
func (sys *system) severListens(ctx context.Context) error {
	// The sessions must be there to be killed.
	if err := sys.awaitListens(ctx, 30*time.Second); err != nil {
		return err
	}
	n, err := sys.pg.terminateBackends(ctx, sys.databases(), relayApplicationName)
	if err != nil {
		return err
	}
	if n < len(kinds) {
		return fmt.Errorf("terminated %d LISTEN sessions, want one per database", n)
	}
	sys.faults.add("listen_killed", int64(n))
	return sys.awaitListens(ctx, 30*time.Second)
}

// awaitListens waits until every database has a LISTEN session.
func (sys *system) awaitListens(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		n, err := sys.listenSessions(ctx)
		if err == nil && len(n) == len(kinds) {
			return nil
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return fmt.Errorf("relays not listening in every database (%v, %v): %w", n, err, ctx.Err())
		}
	}
}

// holdLock takes lock (e.g. "LOCK TABLE wallets IN EXCLUSIVE MODE") in a
// transaction on kind's database and holds it for d, while request sends
// the service requests that need it, in waves, until the service's /readyz
// fails — its pool is starved: every connection is held by a transaction
// waiting for the lock, and /readyz cannot get one — or 96 were sent. The
// lock is held past d until the pool starves (96 requests are six times
// the pool's 16 connections, each waiting for the lock), for at most a
// minute, so that a slow machine delays the starvation but does not
// avoid it. It reports whether the pool starved, and returns once every
// request has completed.
func (sys *system) holdLock(ctx context.Context, kind, lock string, d time.Duration, request func(ctx context.Context, i int) error) (starved bool, err error) {
	tx, err := sys.pools[kind].Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, lock); err != nil {
		return false, fmt.Errorf("%s: %w", lock, err)
	}
	sys.faults.add("lock_held:"+kind, 1)

	var isStarved atomic.Bool
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		for sent := 0; sent < 96 && !isStarved.Load(); sent += 8 {
			for i := sent; i < sent+8; i++ {
				g.Go(func() error { return request(gctx, i) })
			}
			if !sleepCtx(gctx, 250*time.Millisecond) {
				return nil
			}
		}
		return nil
	})
	held, deadline := time.Now().Add(d), time.Now().Add(d+time.Minute)
	for (time.Now().Before(held) || !isStarved.Load()) && time.Now().Before(deadline) && ctx.Err() == nil {
		if err := probe(ctx, sys.url(kind)+"/readyz"); err != nil {
			isStarved.Store(true)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		return isStarved.Load(), err
	}
	return isStarved.Load(), g.Wait()
}

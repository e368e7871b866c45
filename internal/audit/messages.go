package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/audit/internal/platformdb"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/streamscan"
)

const (
	// maxScanned bounds the messages read from one stream. A larger stream
	// is not checked message by message (the ack floor check still holds).
	maxScanned = 1_000_000
	// lookupChunk is how many event ids one inbox lookup sends.
	lookupChunk = 10_000
)

// streamMsg is one message of a saga stream, as its headers describe it.
type streamMsg struct {
	seq     uint64
	subject string
	// eventID is the CloudEvents id; uuid.Nil when the message has none,
	// which no inbox can have processed.
	eventID uuid.UUID
	// eventType and source are the CloudEvents attributes, "" if missing;
	// order is the CloudEvents subject, uuid.Nil if it is no order id.
	eventType event.Type
	source    string
	order     uuid.UUID
}

// deadLetter identifies a DLQ entry: the durable that gave up on a message
// and where that message is stored.
type deadLetter struct {
	durable, stream string
	seq             uint64
}

// scan calls f with every message of stream st, in order, up to the
// stream's last sequence when the scan began. It
// returns false, without scanning, when the stream holds more than limit
// messages.
func scan(ctx context.Context, st jetstream.Stream, limit uint64, f func(seq uint64, subject string, h nats.Header)) (bool, error) {
	return streamscan.ScanAtMost(ctx, st, streamscan.Range{}, limit, func(m streamscan.Message) bool {
		f(m.Seq, m.Subject, m.Header)
		return true
	})
}

// readMessages reads the headers of every message of the topology's streams.
// A stream too large to read is left out of the map.
func (s *system) readMessages(ctx context.Context) (map[string][]streamMsg, error) {
	msgs := make(map[string][]streamMsg)
	for _, spec := range s.topology.Streams {
		st, err := s.js.Stream(ctx, spec.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit: stream %s: %w", spec.Name, err)
		}
		var list []streamMsg
		strs := make(map[string]string) // one string per subject, type and source
		intern := func(s string) string {
			if i, ok := strs[s]; ok {
				return i
			}
			strs[s] = s
			return s
		}
		ok, err := scan(ctx, st, maxScanned, func(seq uint64, subject string, h nats.Header) {
			// uuid.Nil if missing or invalid
			id, _ := uuid.Parse(h.Get(event.HeaderID))
			order, _ := uuid.Parse(h.Get(event.HeaderSubject))
			list = append(list, streamMsg{
				seq: seq, subject: intern(subject), eventID: id,
				eventType: event.Type(intern(h.Get(event.HeaderType))), source: intern(h.Get(event.HeaderSource)), order: order,
			})
		})
		if err != nil {
			return nil, fmt.Errorf("audit: read stream %s: %w", spec.Name, err)
		}
		if ok {
			msgs[spec.Name] = list
		}
	}
	return msgs, nil
}

// dlqContents is what the DLQ holds.
type dlqContents struct {
	// counts are the entries per subject ("dlq.<durable>"), exact.
	counts map[string]uint64
	// reasons and letters are those of every entry; nil when the DLQ was
	// too large to read.
	reasons map[string]map[string]int // per durable, per reason
	letters map[deadLetter]bool
}

// readDLQ reads the DLQ's entries: their number per consumer and, when the
// DLQ is not too large to read, each entry's reason and origin.
func (s *system) readDLQ(ctx context.Context) (dlqContents, error) {
	d := dlqContents{counts: map[string]uint64{}}
	st, err := s.js.Stream(ctx, streams.DLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		d.reasons, d.letters = map[string]map[string]int{}, map[deadLetter]bool{}
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("audit: stream %s: %w", streams.DLQ, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(streams.DLQSubjectPrefix+">"))
	if err != nil {
		return d, fmt.Errorf("audit: stream %s: %w", streams.DLQ, err)
	}
	for subject, n := range info.State.Subjects {
		d.counts[subject] = n
	}
	reasons := make(map[string]map[string]int)
	letters := make(map[deadLetter]bool)
	ok, err := scan(ctx, st, maxScanned, func(_ uint64, subject string, h nats.Header) {
		durable := h.Get(inbox.HeaderDLQConsumer)
		if durable == "" {
			durable = strings.TrimPrefix(subject, streams.DLQSubjectPrefix)
		}
		reason := h.Get(inbox.HeaderDLQReason)
		if reason == "" {
			reason = "(no reason given)"
		}
		if reasons[durable] == nil {
			reasons[durable] = make(map[string]int)
		}
		reasons[durable][reason]++
		if seq, err := strconv.ParseUint(h.Get(inbox.HeaderDLQStreamSeq), 10, 64); err == nil {
			letters[deadLetter{durable: durable, stream: h.Get(inbox.HeaderDLQStream), seq: seq}] = true
		}
	})
	if err != nil {
		return d, fmt.Errorf("audit: read stream %s: %w", streams.DLQ, err)
	}
	if ok {
		d.reasons, d.letters = reasons, letters
	}
	return d, nil
}

// unprocessed returns the messages of cs's stream that cs acked (at or
// below its ack floor) and that have neither an inbox row of cs nor a DLQ
// entry: events whose effect was lost. It also returns how many acked
// events it verified, each once however often it was replayed from the
// DLQ, and how many of the messages were such replays.
func (s *system) unprocessed(ctx context.Context, cs consumerState, msgs []streamMsg, letters map[deadLetter]bool) (lost []streamMsg, verified, replays int, err error) {
	db, ok := s.inboxOf(cs.spec.Durable)
	if !ok {
		return nil, 0, 0, fmt.Errorf("audit: no database holds the inbox of %s", cs.spec.Durable)
	}
	bySeq := make(map[uuid.UUID][]streamMsg)
	var ids []uuid.UUID
	// An event dead-lettered and replayed is one event: its DLQ entry and
	// its replay's inbox row (or its replay's own DLQ entry) verify it once.
	counted := make(map[uuid.UUID]bool)
	count := func(id uuid.UUID) {
		if id == uuid.Nil || !counted[id] {
			verified++
		}
		counted[id] = true
	}
	for _, m := range msgs {
		filtered := slices.ContainsFunc(cs.filters, func(f string) bool { return streams.SubjectMatches(f, m.subject) })
		if m.seq > cs.info.AckFloor.Stream || !filtered {
			continue // not acked yet (the ack floor check reports it), or not its
		}
		if _, _, ok := streams.ReplayOf(m.subject); ok {
			replays++
		}
		if letters[deadLetter{durable: cs.spec.Durable, stream: cs.spec.Stream, seq: m.seq}] {
			count(m.eventID)
			continue
		}
		if m.eventID == uuid.Nil {
			lost = append(lost, m)
			continue
		}
		if _, seen := bySeq[m.eventID]; !seen {
			ids = append(ids, m.eventID)
		}
		bySeq[m.eventID] = append(bySeq[m.eventID], m)
	}
	q := platformdb.New()
	missing := make(map[uuid.UUID]bool)
	for chunk := range slices.Chunk(ids, lookupChunk) {
		rows, err := q.MissingProcessed(ctx, db.pool, platformdb.MissingProcessedParams{EventIds: chunk, Consumer: cs.spec.Durable})
		if err != nil {
			return nil, 0, 0, fmt.Errorf("audit: inbox rows of %s: %w", cs.spec.Durable, err)
		}
		for _, id := range rows {
			missing[id] = true
		}
	}
	for _, id := range ids {
		if missing[id] {
			lost = append(lost, bySeq[id]...)
		} else {
			count(id)
		}
	}
	return lost, verified, replays, nil
}

// inboxOf returns the database that holds durable's inbox rows: durables are
// named "<service>-<subscription>".
func (s *system) inboxOf(durable string) (database, bool) {
	service, _, _ := strings.Cut(durable, "-")
	for _, db := range s.databases() {
		if db.service == service {
			return db, true
		}
	}
	return database{}, false
}

// orderEvents returns the distinct event ids of each type on the saga's
// streams, per order, counting only what the type's owner published on the
// type's subject: a message forged by someone else (the e2e suite's poison,
// all dead-lettered) is no event of the saga. It returns nil when a saga
// stream was too large to read.
func orderEvents(msgs map[string][]streamMsg) map[uuid.UUID]map[event.Type][]uuid.UUID {
	saga := []string{streams.Orders, streams.Payments, streams.Inventory}
	for _, name := range saga {
		if _, read := msgs[name]; !read {
			return nil
		}
	}
	events := make(map[uuid.UUID]map[event.Type][]uuid.UUID)
	for _, name := range saga {
		for _, m := range msgs[name] {
			if m.order == uuid.Nil || m.eventID == uuid.Nil || !published(m) {
				continue
			}
			byType := events[m.order]
			if byType == nil {
				byType = make(map[event.Type][]uuid.UUID)
				events[m.order] = byType
			}
			// A copy of an event (a redrive, a publish past the duplicate
			// window) has its id: one event.
			if !slices.Contains(byType[m.eventType], m.eventID) {
				byType[m.eventType] = append(byType[m.eventType], m.eventID)
			}
		}
	}
	return events
}

// published reports whether m is an event of a saga type, on its subject,
// from the service that owns the type ("onceflow.<owner>.<name>.vN").
func published(m streamMsg) bool {
	subject, err := m.eventType.NATSSubject()
	if err != nil || subject != m.subject {
		return false
	}
	_, rest, _ := strings.Cut(string(m.eventType), ".")
	owner, _, _ := strings.Cut(rest, ".")
	return m.source == owner
}

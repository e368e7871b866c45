package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// Headers a replay carries besides the original's CloudEvents headers.
const (
	// HeaderReplayOf is the DLQ entry (its sequence) the message replays.
	HeaderReplayOf = "Onceflow-Replay-Of"
	// HeaderReplayBy is the operator who replayed it.
	HeaderReplayBy = "Onceflow-Replay-By"
	// HeaderReplayPastRetention is "true" on a replay that an operator
	// forced past the consumer's inbox retention.
	// The inbox lets it through on the durable's own replay subject.
	HeaderReplayPastRetention = inbox.HeaderReplayPastRetention
)

// ErrNotFound is returned for an entry the DLQ does not hold.
var ErrNotFound = errors.New("no such DLQ entry")

// RefusedError is a replay or discard that was not done, and why.
type RefusedError struct {
	Entry  uint64
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("entry %d: refused: %s", e.Entry, e.Reason)
}

// Status is what became of an entry: its last action's kind, or open.
type Status string

// An entry's statuses.
const (
	Open      Status = "open"
	Replayed  Status = "replayed"
	Discarded Status = "discarded"
)

// Action is a replay or a discard, as recorded on the DLQ_ACTIONS stream.
type Action struct {
	Kind     Status    `json:"action"` // Replayed or Discarded
	Entry    uint64    `json:"entry"`
	Consumer string    `json:"consumer"`
	EventID  string    `json:"event_id,omitempty"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason,omitempty"`
	// PastRetention marks a replay forced past the inbox retention.
	PastRetention bool `json:"past_retention,omitempty"`
	// Unverified marks a replay forced of the entry's own copy, its
	// original not re-read (Entry.Unverified says why).
	Unverified bool `json:"unverified,omitempty"`
	// ReplaySubject and ReplaySeq say where the replay was stored.
	ReplaySubject string `json:"replay_subject,omitempty"`
	ReplaySeq     uint64 `json:"replay_seq,omitempty"`
}

// Entry is one dead-lettered message.
type Entry struct {
	ID           uint64    `json:"id"` // its sequence in the DLQ stream
	DeadLettered time.Time `json:"dead_lettered"`
	// Consumer is the durable that gave up: the one whose DLQ subject the
	// entry was written on, whatever its headers say.
	Consumer   string `json:"consumer"`
	Reason     string `json:"reason"`
	Deliveries uint64 `json:"deliveries"`
	// Stream, StreamSeq and Subject are where the original is stored.
	Stream    string `json:"stream"`
	StreamSeq uint64 `json:"stream_seq"`
	Subject   string `json:"subject"`
	// The event's CloudEvents attributes, as far as they could be read.
	EventID     string      `json:"event_id,omitempty"`
	EventType   string      `json:"event_type,omitempty"`
	EventSource string      `json:"event_source,omitempty"`
	OrderID     string      `json:"event_subject,omitempty"`
	EventTime   time.Time   `json:"event_time,omitzero"`
	Headers     nats.Header `json:"headers"`
	// Data is the body; only Get reads it.
	Data    json.RawMessage `json:"data,omitempty"`
	Actions []Action        `json:"actions,omitempty"`
	// Unreplayable says why the entry cannot be replayed at all: its
	// headers disagree with the DLQ subject it was written on or with the
	// topology, or its original would fail the inbox's owner check.
	Unreplayable string `json:"unreplayable,omitempty"`
	// Unverified says why the entry's event could not be checked against
	// its original: the stream no longer (or never) held it at the
	// sequence named, or holds another event there. Such an entry is
	// replayed only when forced, from its own copy.
	Unverified string `json:"unverified,omitempty"`
	// Verified is true when neither is said: the entry's original was
	// re-read from its stream, is its event and passes the owner check, so
	// a replay publishes it.
	Verified bool `json:"verified"`
}

// Status is the entry's last action's kind, or Open.
func (e Entry) Status() Status {
	if len(e.Actions) == 0 {
		return Open
	}
	return e.Actions[len(e.Actions)-1].Kind
}

// LastAction is the entry's last action; ok is false for an open entry.
func (e Entry) LastAction() (a Action, ok bool) {
	if len(e.Actions) == 0 {
		return Action{}, false
	}
	return e.Actions[len(e.Actions)-1], true
}

// entryOf reads an entry's fields from a DLQ message's headers.
func entryOf(seq uint64, at time.Time, subject string, h nats.Header) Entry {
	e := Entry{
		ID:           seq,
		DeadLettered: at,
		Consumer:     strings.TrimPrefix(subject, streams.DLQSubjectPrefix),
		Reason:       h.Get(inbox.HeaderDLQReason),
		Stream:       h.Get(inbox.HeaderDLQStream),
		Subject:      h.Get(inbox.HeaderDLQSubject),
		EventID:      h.Get(event.HeaderID),
		EventType:    h.Get(event.HeaderType),
		EventSource:  h.Get(event.HeaderSource),
		OrderID:      h.Get(event.HeaderSubject),
		Headers:      h,
	}
	e.StreamSeq, _ = strconv.ParseUint(h.Get(inbox.HeaderDLQStreamSeq), 10, 64)
	e.Deliveries, _ = strconv.ParseUint(h.Get(inbox.HeaderDLQDeliveries), 10, 64)
	e.EventTime, _ = time.Parse(time.RFC3339Nano, h.Get(event.HeaderTime))
	return e
}

// Config configures a Store.
type Config struct {
	// Topology is where entries are checked: the durable of each, its
	// stream and the owners of its events.
	Topology streams.Topology
	// DefaultRetention is the inbox retention of a consumer whose metadata
	// does not say; default inbox.DefaultRetention.
	DefaultRetention time.Duration
	// Now is the clock; default time.Now. Tests set it.
	Now func() time.Time
}

// Store reads and acts on the DLQ of one NATS system.
type Store struct {
	js  jetstream.JetStream
	cfg Config
}

// New returns a Store on js.
func New(js jetstream.JetStream, cfg Config) *Store {
	cfg.DefaultRetention = cmp.Or(cfg.DefaultRetention, inbox.DefaultRetention)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{js: js, cfg: cfg}
}

// Get returns entry id with its body and actions, checked against the
// topology and its original (Entry.Unreplayable, Entry.Unverified).
func (s *Store) Get(ctx context.Context, id uint64) (Entry, error) {
	e, err := s.entry(ctx, id)
	if err != nil {
		return Entry{}, err
	}
	_, err = s.verifier().check(ctx, &e)
	return e, err
}

// entry returns entry id with its body and actions, unchecked.
func (s *Store) entry(ctx context.Context, id uint64) (Entry, error) {
	st, err := s.js.Stream(ctx, streams.DLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Entry{}, fmt.Errorf("entry %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("dlq stream: %w", err)
	}
	msg, err := st.GetMsg(ctx, id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Entry{}, fmt.Errorf("entry %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("get entry %d: %w", id, err)
	}
	e := entryOf(msg.Sequence, msg.Time, msg.Subject, msg.Header)
	e.Data = msg.Data
	actions, err := s.actions(ctx, streams.DLQActionsSubjectPrefix+strconv.FormatUint(id, 10))
	if err != nil {
		return Entry{}, err
	}
	e.Actions = actions[id]
	return e, nil
}

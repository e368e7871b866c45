package dlq

import (
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
	"github.com/onceflow/onceflow/internal/streams"
)

// ReplayOptions are a replay's who and how.
type ReplayOptions struct {
	By string // who replays; required
	// PastRetention replays an event older than the consumer's inbox
	// retention all the same. Its processed_events row may have been
	// deleted: if the event was processed after all, the consumer applies
	// it a second time. For an operator who knows it was not.
	PastRetention bool
	// Force replays an unverified entry (Entry.Unverified): its original
	// cannot be re-read, so the entry's own copy is published, which is
	// only what the entry's writer says the event was. For an operator who
	// has checked it. An unreplayable entry is refused all the same.
	Force bool
}

// Replay publishes entry id's event again to the consumer that gave up on
// it, with the same event id and type, and records the replay. What it
// publishes is the original, re-read from its stream, after the inbox's
// owner check; never a header of the entry's nor an override the operator
// did not give. It refuses (a *RefusedError) an entry already replayed or
// discarded, an unreplayable one, an unverified one unless opts.Force, and
// one older than the consumer's inbox retention unless opts.PastRetention.
func (s *Store) Replay(ctx context.Context, id uint64, opts ReplayOptions) (Action, error) {
	if opts.By == "" {
		return Action{}, errors.New("replay: who replays is required")
	}
	e, err := s.entry(ctx, id)
	if err != nil {
		return Action{}, err
	}
	if err := refuseClosed(e); err != nil {
		return Action{}, err
	}
	msg, err := s.replayed(ctx, &e, opts)
	if err != nil {
		return Action{}, err
	}
	ev, err := event.FromMsg(msg.Header, msg.Data)
	if err != nil {
		return Action{}, &RefusedError{Entry: id, Reason: err.Error()}
	}
	if err := s.refusePastRetention(ctx, e, ev, opts); err != nil {
		return Action{}, err
	}
	h := nats.Header{}
	for k, v := range msg.Header {
		// The DLQ's own headers, an earlier replay's and the original's
		// Nats-* instructions stay behind.
		if !strings.HasPrefix(k, "Onceflow-Dlq-") && !strings.HasPrefix(k, "Onceflow-Replay-") && !strings.HasPrefix(k, "Nats-") {
			h[k] = v
		}
	}
	h.Set(HeaderReplayOf, strconv.FormatUint(id, 10))
	h.Set(HeaderReplayBy, opts.By)
	if opts.PastRetention {
		h.Set(HeaderReplayPastRetention, "true")
	}
	// The replay's own id for the broker's dedup: the event id would be
	// dropped as the original within the duplicate window; replaying one
	// entry twice (a retried command) is dropped.
	h.Set(jetstream.MsgIDHeader, fmt.Sprintf("replay:%s:%d:%s", e.Consumer, id, ev.ID))
	subject := streams.ReplaySubject(msg.Subject, e.Consumer)
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: msg.Data}, jetstream.WithExpectStream(e.Stream))
	if err != nil {
		return Action{}, fmt.Errorf("replay entry %d on %s: %w", id, subject, err)
	}
	a := Action{
		Kind: Replayed, Entry: id, Consumer: e.Consumer, EventID: ev.ID.String(), By: opts.By,
		PastRetention: opts.PastRetention, Unverified: e.Unverified != "", ReplaySubject: subject, ReplaySeq: ack.Sequence,
	}
	return s.record(ctx, a)
}

// replayed is the message a replay of e publishes: its original, re-read,
// or, forced, e's own copy when the original cannot be re-read.
func (s *Store) replayed(ctx context.Context, e *Entry, opts ReplayOptions) (*nats.Msg, error) {
	v := s.verifier()
	orig, err := v.check(ctx, e)
	switch {
	case err != nil:
		return nil, err
	case e.Unreplayable != "":
		return nil, &RefusedError{Entry: e.ID, Reason: "unreplayable: " + e.Unreplayable}
	case orig != nil:
		return &nats.Msg{Subject: orig.Subject, Header: orig.Header, Data: orig.Data}, nil
	case !opts.Force:
		return nil, &RefusedError{Entry: e.ID, Reason: "not verifiable: " + e.Unverified +
			"; replaying the entry's own copy, which is only what its writer says, is an explicit override (force)"}
	}
	if _, err := v.ownCopy(*e); err != nil {
		return nil, &RefusedError{Entry: e.ID, Reason: "unreplayable: " + err.Error()}
	}
	return &nats.Msg{Subject: e.Subject, Header: e.Headers, Data: e.Data}, nil
}

// refusePastRetention refuses a replay of ev, unless opts.PastRetention,
// when ev is older than e's consumer's inbox retention.
func (s *Store) refusePastRetention(ctx context.Context, e Entry, ev event.Envelope, opts ReplayOptions) error {
	retention, err := s.retention(ctx, e.Stream, e.Consumer)
	if err != nil {
		return err
	}
	// As the inbox reckons it: from the earlier of the event's time and the
	// time in its id.
	born := ev.Time
	if minted := ev.Minted(); minted.Before(born) {
		born = minted
	}
	if age := s.cfg.Now().Sub(born); age > retention && !opts.PastRetention {
		return &RefusedError{Entry: e.ID, Reason: fmt.Sprintf(
			"event %s is %s old, beyond %s's inbox retention of %s: its processed_events row may be deleted, so if it was processed after all a replay would apply it twice (replaying past the retention is an explicit override)",
			ev.ID, age.Round(time.Second), e.Consumer, retention)}
	}
	return nil
}

// Discard records that entry id is not to be replayed, and why.
func (s *Store) Discard(ctx context.Context, id uint64, by, reason string) (Action, error) {
	if by == "" || strings.TrimSpace(reason) == "" {
		return Action{}, errors.New("discard: who discards and why are required")
	}
	e, err := s.Get(ctx, id)
	if err != nil {
		return Action{}, err
	}
	if err := refuseClosed(e); err != nil {
		return Action{}, err
	}
	return s.record(ctx, Action{Kind: Discarded, Entry: id, Consumer: e.Consumer, EventID: e.EventID, By: by, Reason: reason})
}

// refuseClosed refuses to act on an entry already replayed or discarded.
func refuseClosed(e Entry) error {
	a, ok := e.LastAction()
	if !ok {
		return nil
	}
	return &RefusedError{Entry: e.ID, Reason: fmt.Sprintf("already %s by %s at %s", a.Kind, a.By, a.At.UTC().Format(time.RFC3339))}
}

// record stamps a and appends it to the DLQ_ACTIONS stream.
func (s *Store) record(ctx context.Context, a Action) (Action, error) {
	a.At = s.cfg.Now().UTC()
	data, err := json.Marshal(a)
	if err != nil {
		return Action{}, fmt.Errorf("encode action: %w", err)
	}
	if _, err := s.js.Publish(ctx, actionsSubject(a.Entry), data); err != nil {
		return Action{}, fmt.Errorf("record the %s of entry %d: %w", a.Kind, a.Entry, err)
	}
	return a, nil
}

// retention is the inbox retention of durable on stream, from its metadata.
func (s *Store) retention(ctx context.Context, stream, durable string) (time.Duration, error) {
	cons, err := s.js.Consumer(ctx, stream, durable)
	if err != nil {
		return 0, fmt.Errorf("consumer %s on %s: %w", durable, stream, err)
	}
	v, ok := cons.CachedInfo().Config.Metadata[streams.MetadataInboxRetention]
	if !ok {
		return s.cfg.DefaultRetention, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("consumer %s: metadata %s=%q is not a duration", durable, streams.MetadataInboxRetention, v)
	}
	return d, nil
}

// ReplayResult is what became of one entry of ReplayAll.
type ReplayResult struct {
	Entry  uint64
	Action Action // when replayed
	Err    error  // else why not
}

// ReplayAll replays every open entry f selects (its Status is ignored),
// and returns what became of each; an entry refused does not stop the
// others.
func (s *Store) ReplayAll(ctx context.Context, f Filter, opts ReplayOptions) ([]ReplayResult, error) {
	f.Status = Open
	var out []ReplayResult
	for {
		page, err := s.List(ctx, f)
		if err != nil {
			return out, err
		}
		for _, e := range page.Entries {
			a, err := s.Replay(ctx, e.ID, opts)
			var refused *RefusedError
			if err != nil && !errors.As(err, &refused) {
				return append(out, ReplayResult{Entry: e.ID, Err: err}), err
			}
			out = append(out, ReplayResult{Entry: e.ID, Action: a, Err: err})
		}
		if page.Next == 0 {
			return out, nil
		}
		f.After = page.Next
	}
}

package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// A DLQ entry is what its writer says: any holder of a durable's
// credentials can write one on dlq.<durable>. So an entry is checked
// before it is shown or replayed, and what is replayed is the original
// message, re-read from its stream.

// check sets e.Unreplayable or e.Unverified, and returns the original
// message when it could be re-read and matches the entry. A non-nil error
// is NATS failing to answer, not a verdict.
func (v *verifier) check(ctx context.Context, e *Entry) (*jetstream.RawStreamMsg, error) {
	e.Unreplayable, e.Unverified, e.Verified = v.binding(*e), "", false
	if e.Unreplayable != "" {
		return nil, nil
	}
	orig, why, err := v.original(ctx, *e)
	if err != nil || why != "" {
		e.Unverified = why
		return nil, err
	}
	ev, err := event.FromMsg(orig.Header, orig.Data)
	if err == nil {
		err = inbox.CheckOwner(v.topology, e.Consumer, orig.Subject, ev)
	}
	if err != nil {
		// The stream holds it, but the consumer would dead-letter it again.
		e.Unreplayable = fmt.Sprintf("its original fails the inbox's checks: %v", err)
		return nil, nil
	}
	e.Verified = true
	return orig, nil
}

// binding is why e cannot be replayed whatever the stream holds, or "": its
// headers must agree with the durable whose DLQ subject it was written on
// and with the topology.
func (v *verifier) binding(e Entry) string {
	if h := e.Headers.Get(inbox.HeaderDLQConsumer); h != e.Consumer {
		return fmt.Sprintf("it was written on %s%s, but its %s header names %q", streams.DLQSubjectPrefix, e.Consumer, inbox.HeaderDLQConsumer, h)
	}
	cons, ok := v.topology.Consumer(e.Consumer)
	if !ok {
		return fmt.Sprintf("durable %s is not in the topology", e.Consumer)
	}
	if e.Stream != cons.Stream {
		return fmt.Sprintf("its %s header names stream %q, but %s consumes %s", inbox.HeaderDLQStream, e.Stream, e.Consumer, cons.Stream)
	}
	return ""
}

// ownCopy is the event in e's own body, when it passes the inbox's checks
// on e's subject: what a forced replay of an unverified entry publishes.
func (v *verifier) ownCopy(e Entry) (event.Envelope, error) {
	ev, err := event.FromMsg(e.Headers, e.Data)
	if err != nil {
		return event.Envelope{}, fmt.Errorf("it holds no event that can be processed (%v); the consumer would dead-letter it again", err)
	}
	if err := inbox.CheckOwner(v.topology, e.Consumer, e.Subject, ev); err != nil {
		return event.Envelope{}, fmt.Errorf("its own copy fails the inbox's checks: %v", err)
	}
	return ev, nil
}

// original re-reads e's original from its stream; why says why it is not
// the entry's event ("" when it is).
func (v *verifier) original(ctx context.Context, e Entry) (_ *jetstream.RawStreamMsg, why string, _ error) {
	if e.StreamSeq == 0 {
		return nil, "it names no sequence of its original in " + e.Stream, nil
	}
	st, err := v.stream(ctx, e.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Sprintf("stream %s does not exist", e.Stream), nil
	}
	if err != nil {
		return nil, "", err
	}
	where := fmt.Sprintf("%s sequence %d", e.Stream, e.StreamSeq)
	msg, err := st.GetMsg(ctx, e.StreamSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound) && e.StreamSeq > st.CachedInfo().State.LastSeq:
		return nil, fmt.Sprintf("%s was never stored: its original cannot be re-read", where), nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, fmt.Sprintf("%s is no longer in the stream (aged out or deleted): its original cannot be re-read", where), nil
	case err != nil:
		return nil, "", fmt.Errorf("re-read %s: %w", where, err)
	case msg.Subject != e.Subject:
		return nil, fmt.Sprintf("%s is on subject %s, not %s as the entry says", where, msg.Subject, e.Subject), nil
	}
	if id := msg.Header.Get(event.HeaderID); id != e.EventID {
		return nil, fmt.Sprintf("%s holds event %q, not the entry's %q", where, id, e.EventID), nil
	}
	return msg, "", nil
}

// verifier checks entries against one topology, reading each stream's
// state once.
type verifier struct {
	js       jetstream.JetStream
	topology streams.Topology
	streams  map[string]jetstream.Stream
}

func (s *Store) verifier() *verifier {
	return &verifier{js: s.js, topology: s.cfg.Topology, streams: map[string]jetstream.Stream{}}
}

func (v *verifier) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if st, ok := v.streams[name]; ok {
		return st, nil
	}
	st, err := v.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	v.streams[name] = st
	return st, nil
}

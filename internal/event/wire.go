package event

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Header names of the CloudEvents NATS binding in binary content mode: each
// attribute is a "ce-" header and the payload is the message body.
const (
	HeaderSpecVersion = "ce-specversion"
	HeaderID          = "ce-id"
	HeaderType        = "ce-type"
	HeaderSource      = "ce-source"
	HeaderSubject     = "ce-subject"
	HeaderTime        = "ce-time"
	HeaderContentType = "content-type"
	HeaderTraceParent = "traceparent"
)

const specVersion = "1.0"

// Msg is the NATS message of an envelope. Its Nats-Msg-Id is the event id, so
// JetStream drops a re-publish within the stream's duplicate window.
func (e Envelope) Msg() (*nats.Msg, error) {
	subject, err := e.Type.NATSSubject()
	if err != nil {
		return nil, err
	}
	h := nats.Header{}
	h.Set(HeaderSpecVersion, specVersion)
	h.Set(HeaderID, e.ID.String())
	h.Set(HeaderType, string(e.Type))
	h.Set(HeaderSource, e.Source)
	h.Set(HeaderSubject, e.Subject)
	h.Set(HeaderTime, e.Time.UTC().Format(time.RFC3339Nano))
	h.Set(HeaderContentType, "application/json")
	h.Set(jetstream.MsgIDHeader, e.ID.String())
	if e.TraceParent != "" {
		h.Set(HeaderTraceParent, e.TraceParent)
	}
	return &nats.Msg{Subject: subject, Header: h, Data: e.Data}, nil
}

// FromMsg reads an envelope from a message's headers and body. Every failure
// wraps ErrInvalid: such a message can never be processed.
func FromMsg(h nats.Header, data []byte) (Envelope, error) {
	if v := h.Get(HeaderSpecVersion); v != specVersion {
		return Envelope{}, fmt.Errorf("%w: specversion %q, want %q", ErrInvalid, v, specVersion)
	}
	id, err := uuid.Parse(h.Get(HeaderID))
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: id %q: %v", ErrInvalid, h.Get(HeaderID), err)
	}
	at, err := time.Parse(time.RFC3339Nano, h.Get(HeaderTime))
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: %s: time %q: %v", ErrInvalid, id, h.Get(HeaderTime), err)
	}
	env := Envelope{
		ID:          id,
		Type:        Type(h.Get(HeaderType)),
		Source:      h.Get(HeaderSource),
		Subject:     h.Get(HeaderSubject),
		Time:        at,
		Data:        data,
		TraceParent: h.Get(HeaderTraceParent),
	}
	if err := env.Validate(); err != nil {
		return Envelope{}, err
	}
	return env, nil
}

// Package dlqtest stores DLQ entries for tests, as the inbox stores them.
package dlqtest

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// DeadLetter stores ev in the DLQ as the inbox would have, had durable given
// up on it (stored on stream) for reason, and returns the entry's id. The
// DLQ stream must exist.
func DeadLetter(t testing.TB, js jetstream.JetStream, ev event.Envelope, stream, durable, reason string) uint64 {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	return DeadLetterMsg(t, js, msg, stream, 1, durable, reason)
}

// DeadLetterMsg stores msg, message seq of stream, in the DLQ as the inbox
// would have, had durable given up on it for reason, and returns the
// entry's id.
func DeadLetterMsg(t testing.TB, js jetstream.JetStream, msg *nats.Msg, stream string, seq uint64, durable, reason string) uint64 {
	t.Helper()
	h := nats.Header{}
	for k, v := range msg.Header {
		if k != jetstream.MsgIDHeader {
			h[k] = v
		}
	}
	h.Set(inbox.HeaderDLQReason, reason)
	h.Set(inbox.HeaderDLQConsumer, durable)
	h.Set(inbox.HeaderDLQStream, stream)
	h.Set(inbox.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	h.Set(inbox.HeaderDLQDeliveries, "10")
	h.Set(inbox.HeaderDLQSubject, msg.Subject)
	ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: streams.DLQSubjectPrefix + durable, Header: h, Data: msg.Data})
	require.NoError(t, err)
	return ack.Sequence
}

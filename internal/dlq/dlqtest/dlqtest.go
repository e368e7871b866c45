// Package dlqtest stores DLQ entries for tests, as the inbox stores them.
package dlqtest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// DeadLetter publishes ev on its subject (the broker drops it as a
// duplicate if it is there already) and stores it in the DLQ as the inbox
// would have, had durable given up on it, for reason; it returns the
// entry's id. The streams must exist.
func DeadLetter(t testing.TB, js jetstream.JetStream, ev event.Envelope, stream, durable, reason string) uint64 {
	t.Helper()
	msg, err := ev.Msg()
	require.NoError(t, err)
	ack, err := js.PublishMsg(t.Context(), msg, jetstream.WithExpectStream(stream))
	require.NoError(t, err)
	return DeadLetterMsg(t, js, msg, stream, ack.Sequence, durable, reason)
}

// DeadLetterMsg stores msg, message seq of stream, in the DLQ as the inbox
// would have, had durable given up on it for reason, and returns the
// entry's id.
func DeadLetterMsg(t testing.TB, js jetstream.JetStream, msg *nats.Msg, stream string, seq uint64, durable, reason string) uint64 {
	t.Helper()
	return Write(t, js, durable, Headers(msg, stream, seq, durable, reason), msg.Data)
}

// Headers are the headers of the dead letter of msg, message seq of stream,
// had durable given up on it for reason: msg's own and the inbox's.
func Headers(msg *nats.Msg, stream string, seq uint64, durable, reason string) nats.Header {
	h := nats.Header{}
	for k, v := range msg.Header {
		// As the inbox does: the original's instructions to the broker stay
		// behind.
		if !strings.HasPrefix(k, "Nats-") {
			h[k] = v
		}
	}
	h.Set(inbox.HeaderDLQReason, reason)
	h.Set(inbox.HeaderDLQConsumer, durable)
	h.Set(inbox.HeaderDLQStream, stream)
	h.Set(inbox.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	h.Set(inbox.HeaderDLQDeliveries, "10")
	h.Set(inbox.HeaderDLQSubject, msg.Subject)
	return h
}

// Write publishes, as js, an entry with h and data on durable's DLQ
// subject, and returns its id: what a holder of durable's credentials can
// write, whatever h says.
func Write(t testing.TB, js jetstream.JetStream, durable string, h nats.Header, data []byte) uint64 {
	t.Helper()
	ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: streams.DLQSubjectPrefix + durable, Header: h, Data: data})
	require.NoError(t, err)
	return ack.Sequence
}

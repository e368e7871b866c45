package inbox

import (
	"github.com/nats-io/nats.go"

	"github.com/onceflow/onceflow/internal/event"
)

// SetSkipAck makes c skip the ack of a committed message for which skip
// returns true, as a crash between commit and ack would. Call it before Run.
func (c *Consumer) SetSkipAck(skip func(event.Envelope) bool) {
	c.skipSettle = func(ev event.Envelope, o Outcome) bool { return o == OutcomeProcessed && skip(ev) }
}

// SetSkipSettle makes c leave unsettled (neither acked, naked nor
// dead-lettered) every message for which skip returns true, as a process
// that dies while processing it would. A delivery past the consumer's
// budget runs no handler and is settled all the same. Call it before Run.
func (c *Consumer) SetSkipSettle(skip func(event.Envelope) bool) {
	c.skipSettle = func(ev event.Envelope, o Outcome) bool { return !deadLettering(o) && skip(ev) }
}

// SetSkipTerm makes c skip the term of a message it dead-lettered, for
// which skip returns true, as a term lost on its way or a crash between the
// DLQ's copy and the term would: the server delivers it again. Call it
// before Run.
func (c *Consumer) SetSkipTerm(skip func(event.Envelope) bool) {
	c.skipSettle = func(ev event.Envelope, o Outcome) bool { return deadLettering(o) && skip(ev) }
}

func deadLettering(o Outcome) bool { return o == OutcomeDeadLettered || o == OutcomeExhausted }

// SetDecoder replaces how c reads a message's envelope (event.FromMsg), so
// that a test can make the decoder panic. Call it before Run.
func (c *Consumer) SetDecoder(fromMsg func(nats.Header, []byte) (event.Envelope, error)) {
	c.fromMsg = fromMsg
}

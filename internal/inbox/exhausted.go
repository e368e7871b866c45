package inbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/streams"
)

// The last delivery is the inbox's, never the server's. JetStream, left to
// count deliveries itself (a finite MaxDeliver), gives up on a message when
// its last delivery's ack wait ends unsettled — the process died in it — and
// says so only in an advisory to whoever listens at that moment. So the
// durable is provisioned with an unlimited MaxDeliver (streams.Provision):
// the server redelivers a message until the inbox settles it, and no
// message leaves the durable unless the inbox acked, terminated or
// dead-lettered it. The inbox keeps the count instead, the durable's budget
// (streams.MetadataMaxDeliver): the deliveries that run the handler. The
// last of them dead-letters the message if it fails (fail); a delivery past
// the budget comes only when those before never settled (the process died
// in each, or the DLQ refused the copy), and runs no handler: its claim
// tells whether the event was processed after all (then it is acked as a
// duplicate), and if not it is dead-lettered (processOne). It comes
// whenever a consumer of the durable next pulls, however long every
// replica was down, and each message has its own: there is no second
// channel to overflow or to forge.

// budget is the delivery budget of the durable configured as cfg, read from
// its metadata: 0 (none, retried until processed) when it has none. A
// durable whose server gives up by itself is refused: what it gives up on
// would leave unrecorded.
func budget(cfg jetstream.ConsumerConfig) (int, error) {
	if cfg.MaxDeliver > 0 {
		return 0, fmt.Errorf("MaxDeliver is %d: the server would drop a message whose last delivery never settles, unrecorded; "+
			"provision the durable with streams.Provision (MaxDeliver -1, the inbox's budget in metadata %s)", cfg.MaxDeliver, streams.MetadataMaxDeliver)
	}
	v, ok := cfg.Metadata[streams.MetadataMaxDeliver]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("metadata %s=%q is not a positive number", streams.MetadataMaxDeliver, v)
	}
	return n, nil
}

// lastTry reports whether d is the last delivery that runs the handler, or
// later: a failure is dead-lettered, not naked.
func (c *Consumer) lastTry(d *delivery) bool {
	return c.maxDeliver > 0 && d.meta.NumDelivered >= uint64(c.maxDeliver)
}

// spent reports whether d comes past the budget: the deliveries that ran
// the handler never settled, and this one dead-letters the event unless it
// was processed.
func (c *Consumer) spent(d *delivery) bool {
	return c.maxDeliver > 0 && d.meta.NumDelivered > uint64(c.maxDeliver)
}

// exhausted dead-letters d's message, delivered past the budget, whose
// claim found its event unprocessed.
func (c *Consumer) exhausted(ctx context.Context, d *delivery) Outcome {
	reason := fmt.Sprintf("delivered %d times, past the budget of %d that run the handler, none of which settled: "+
		"the process stopped while processing it, or the DLQ refused its copy", d.meta.NumDelivered, c.maxDeliver)
	return c.deadLetter(ctx, d, OutcomeExhausted, reason)
}

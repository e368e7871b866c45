package inbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
)

// A message is dead-lettered by the inbox at its last delivery. But when
// that delivery never settles — the process died in it, or its
// dead-lettering failed and it was naked — JetStream stops delivering it
// with no dead letter. The server announces that with an advisory, which
// the consumer watches: it reads the message back from its stream and
// dead-letters it with the reason, logs it, and reports it to the Observer
// (OutcomeExhausted). The DLQ's dedup (one message id per stored message)
// keeps a message that was dead-lettered already from being stored twice.

// MaxDeliveriesAdvisoryPrefix is the subject prefix of JetStream's
// advisories for messages that reached their consumer's MaxDeliver:
// the stream and the durable follow.
const MaxDeliveriesAdvisoryPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."

// maxDeliveriesAdvisory is the part of the advisory the inbox reads.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// watchExhausted dead-letters every message of the consumer that JetStream
// announces it gave up on, until ctx is done.
func (c *Consumer) watchExhausted(ctx context.Context) error {
	advisories := make(chan *nats.Msg, 64)
	sub, err := c.js.Conn().ChanSubscribe(MaxDeliveriesAdvisoryPrefix+c.cfg.Stream+"."+c.cfg.Durable, advisories)
	if err != nil {
		return fmt.Errorf("watch %s's max deliveries: %w", c.cfg.Durable, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-advisories:
			var adv maxDeliveriesAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				c.logger.ErrorContext(ctx, "unreadable max deliveries advisory", "err", err)
				continue
			}
			c.exhausted(ctx, adv)
		}
	}
}

// exhausted dead-letters the message adv names, read back from its stream.
func (c *Consumer) exhausted(ctx context.Context, adv maxDeliveriesAdvisory) {
	logger := c.logger.With("stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
	c.cfg.Observer.Settled(event.Envelope{}, OutcomeExhausted, adv.Deliveries)
	msg, err := c.readBack(ctx, adv.StreamSeq)
	if err != nil {
		logger.ErrorContext(ctx, "a message ran out of deliveries unsettled, and cannot be read back to dead-letter it", "err", err)
		return
	}
	reason := fmt.Sprintf("JetStream gave up after %d deliveries (MaxDeliver) that the inbox did not settle: the process died while processing it, or its dead-lettering failed", adv.Deliveries)
	dlq := c.dlqMsg(msg.Header, msg.Data, msg.Subject, adv.Stream, adv.StreamSeq, adv.Deliveries, reason)
	if _, err := c.js.PublishMsg(ctx, dlq); err != nil {
		logger.ErrorContext(ctx, "a message ran out of deliveries unsettled, and dead-lettering it failed", "err", err)
		return
	}
	c.deadLettered.Add(1)
	logger.ErrorContext(ctx, "a message ran out of deliveries unsettled; dead-lettered", "event_id", msg.Header.Get(event.HeaderID))
}

// readBack reads the message at seq from the consumer's stream.
func (c *Consumer) readBack(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return nil, err
	}
	return s.GetMsg(ctx, seq)
}

// Package jsbatch hands the messages of a JetStream pull consumer to a
// function in batches: a message that comes alone at once, a burst as one
// batch.
//
// It keeps a pull request waiting at the broker (jetstream's Consume), which
// the client renews when half of its messages have come, so a message is
// delivered as soon as it is stored, without a request of its own, and the
// next ones arrive while a batch is processed. Fetching instead, a consumer
// that returns as soon as one message is there sends two pull requests per
// batch under light load (one that waits for a message, one that takes what
// came with it), each a subscription and a round trip through the broker's
// API.
package jsbatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Consume calls process with batches of up to size messages of cons, one
// batch at a time, until ctx is done; then it stops asking for messages,
// calls process with those on their way, and returns nil. It returns an
// error only when consuming ended by itself: the NATS connection closed for
// good, or the consumer deleted. Errors consuming recovers from (a missed
// heartbeat, a reconnection) are logged.
//
// At most size messages wait in hand and size more are asked for, besides
// the batch being processed.
func Consume(ctx context.Context, cons jetstream.Consumer, size int, logger *slog.Logger, process func([]jetstream.Msg)) error {
	arrived := make(chan jetstream.Msg, size)
	name := cons.CachedInfo().Name
	var (
		mu      sync.Mutex
		lastErr error // the latest that consuming reported
	)
	cc, err := cons.Consume(func(msg jetstream.Msg) { arrived <- msg },
		jetstream.PullMaxMessages(size),
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			mu.Lock()
			lastErr = err
			mu.Unlock()
			logger.WarnContext(ctx, "consuming", "consumer", name, "err", err)
		}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		select {
		case <-ctx.Done():
			cc.Drain() // the messages on their way still arrive
		case <-cc.Closed():
		}
		<-cc.Closed() // the callback above is called no more
		close(arrived)
	}()

	for msg := range arrived {
		process(batch(msg, arrived, size))
	}
	if ctx.Err() != nil {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	return fmt.Errorf("consume ended: %w", cmp.Or(lastErr, errEnded))
}

// pullExpiry bounds how long a pull request waits at the broker before the
// client renews it. A renewal that goes missing leaves the consumer idle
// until the request expires (seen about once in a hundred runs of
// TestBatchesHoldAtMostSize, which waited out jetstream's 30s default);
// an idle consumer pays one pull request per expiry.
const pullExpiry = 5 * time.Second

// errEnded is why consuming that reported no error ended.
var errEnded = errors.New("the subscription closed")

// burstWait bounds how long batch waits for a message that the broker had
// pending when it delivered the last one, and that another subscriber of
// the same consumer may have been given instead.
const burstWait = 5 * time.Millisecond

// batch returns first and the messages that came with it, up to size: those
// already in hand, and those the broker had pending right behind the last
// one taken (its NumPending), which are on their way. So a burst is one
// batch however the goroutines that hand it over are scheduled, and a
// message that came alone is processed at once.
func batch(first jetstream.Msg, arrived <-chan jetstream.Msg, size int) []jetstream.Msg {
	msgs := append(make([]jetstream.Msg, 0, size), first)
	var timeout <-chan time.Time
	for len(msgs) < size {
		select {
		case msg, ok := <-arrived:
			if !ok {
				return msgs
			}
			msgs = append(msgs, msg)
			continue
		default:
		}
		if meta, err := msgs[len(msgs)-1].Metadata(); err != nil || meta.NumPending == 0 {
			return msgs
		}
		if timeout == nil {
			timeout = time.After(burstWait)
		}
		select {
		case msg, ok := <-arrived:
			if !ok {
				return msgs
			}
			msgs = append(msgs, msg)
		case <-timeout:
			return msgs
		}
	}
	return msgs
}

package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/audit/internal/notifydb"
	"github.com/onceflow/onceflow/internal/audit/internal/orderdb"
	"github.com/onceflow/onceflow/internal/audit/internal/platformdb"
	"github.com/onceflow/onceflow/internal/streams"
)

// waitQuiet polls until the system is quiet or wait has passed, and returns
// what was still moving when it gave up ("" when quiet). With wait zero it
// looks once.
func (s *system) waitQuiet(ctx context.Context, wait, interval time.Duration, logger *slog.Logger) (string, error) {
	deadline := time.Now().Add(wait)
	lastLog := time.Now()
	for {
		moving, err := s.moving(ctx)
		if err != nil {
			return "", err
		}
		if moving == "" || !time.Now().Before(deadline) {
			return moving, nil
		}
		if time.Since(lastLog) >= progressInterval {
			logger.InfoContext(ctx, "waiting for the system to go quiet", "moving", moving, "left", time.Until(deadline).Round(time.Second))
			lastLog = time.Now()
		}
		timer := time.NewTimer(min(interval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			timer.Stop()
			return "", fmt.Errorf("audit: wait for quiet: %w", ctx.Err())
		case <-timer.C:
		}
	}
}

// moving says what the system is still doing, or "" when it is quiet.
//
// The databases and the broker cannot be read at one instant, so the broker
// is read before and after the databases, and the system is quiet only if
// nothing moved in between: then every event published before the outboxes
// were seen empty had been processed, and processing it had committed its
// own outbox rows, which were seen.
func (s *system) moving(ctx context.Context) (string, error) {
	before, err := s.brokerProgress(ctx)
	if err != nil {
		return "", err
	}
	var why []string
	for _, c := range before.consumers {
		if c.pending > 0 || c.unacked > 0 {
			why = append(why, fmt.Sprintf("%s: %d undelivered, %d unacked", c.durable, c.pending, c.unacked))
		}
	}

	unfinished, err := orderdb.New().CountUnfinishedOrders(ctx, s.order.pool)
	if err != nil {
		return "", fmt.Errorf("audit: count unfinished orders: %w", err)
	}
	if unfinished > 0 {
		why = append(why, plural(int(unfinished), "order")+" not terminal")
	}
	for _, db := range s.databases() {
		stats, err := platformdb.New().OutboxStats(ctx, db.pool)
		if err != nil {
			return "", fmt.Errorf("audit: %s outbox: %w", db.service, err)
		}
		if stats.Unsent > 0 {
			why = append(why, fmt.Sprintf("%s unsent in the %s outbox", plural(int(stats.Unsent), "row"), db.service))
		}
	}
	mails, err := notifydb.New().CountPendingNotifications(ctx, s.notify.pool)
	if err != nil {
		return "", fmt.Errorf("audit: count pending e-mails: %w", err)
	}
	if mails > 0 {
		why = append(why, plural(int(mails), "e-mail")+" pending")
	}

	after, err := s.brokerProgress(ctx)
	if err != nil {
		return "", err
	}
	if !before.equal(after) {
		why = append(why, "events published or acked while looking")
	}
	return strings.Join(why, "; "), nil
}

// progress is where the streams and the saga's consumers are.
type progress struct {
	lastSeq   map[string]uint64 // per stream, the DLQ included
	consumers []consumerProgress
}

type consumerProgress struct {
	durable  string
	pending  uint64 // not yet delivered
	unacked  int    // delivered, not acked (or waiting for a redelivery)
	ackFloor uint64 // stream sequence
}

func (p progress) equal(q progress) bool {
	return maps.Equal(p.lastSeq, q.lastSeq) && slices.Equal(p.consumers, q.consumers)
}

// brokerProgress reads the last sequence of every stream and the state of
// every consumer of the topology. A stream or consumer that does not exist
// is left out: it cannot move, and the consumers check reports it.
func (s *system) brokerProgress(ctx context.Context) (progress, error) {
	p := progress{lastSeq: make(map[string]uint64)}
	names := []string{streams.DLQ}
	for _, st := range s.topology.Streams {
		names = append(names, st.Name)
	}
	for _, name := range names {
		st, err := s.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return progress{}, fmt.Errorf("audit: stream %s: %w", name, err)
		}
		// The info Stream fetched is fresh.
		p.lastSeq[name] = st.CachedInfo().State.LastSeq
	}
	for _, c := range s.topology.Consumers {
		info, err := s.consumerInfo(ctx, c)
		if err != nil {
			return progress{}, err
		}
		if info == nil {
			continue
		}
		p.consumers = append(p.consumers, consumerProgress{
			durable:  c.Durable,
			pending:  info.NumPending,
			unacked:  info.NumAckPending,
			ackFloor: info.AckFloor.Stream,
		})
	}
	return p, nil
}

// consumerInfo returns the state of consumer c, or nil if it or its stream
// does not exist.
func (s *system) consumerInfo(ctx context.Context, c streams.Consumer) (*jetstream.ConsumerInfo, error) {
	cons, err := s.js.Consumer(ctx, c.Stream, c.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	// Consumer fetched the info; it is fresh.
	return cons.CachedInfo(), nil
}

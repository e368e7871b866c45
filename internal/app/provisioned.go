package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/streams"
)

// provisionPoll is how often a service looks for its durables until
// `onceflow provision` has created them.
const provisionPoll = time.Second

// provisioned tells whether the durables of a service's subscriptions
// exist. A service has no right to create them (`onceflow provision` does,
// as an identity of its own), and may start first: it waits for them
// instead of failing.
type provisioned struct {
	subs     []Subscription
	topology streams.Topology       // where each durable's stream is
	missing  atomic.Pointer[string] // why not ready; nil once every durable exists
}

func newProvisioned(subs []Subscription) *provisioned {
	p := &provisioned{subs: subs, topology: saga()}
	if len(subs) > 0 {
		p.setMissing(subs[0], nil)
	}
	return p
}

func (p *provisioned) setMissing(sub Subscription, err error) {
	why := fmt.Sprintf("waiting for `onceflow provision` to create durable %s on stream %s", sub.Durable, streamOf(p.topology, sub.Durable))
	if err != nil {
		why += fmt.Sprintf(" (%v)", err)
	}
	p.missing.Store(&why)
}

// ready returns nil once every durable exists, else what is missing.
func (p *provisioned) ready() error {
	if why := p.missing.Load(); why != nil {
		return errors.New(*why)
	}
	return nil
}

// wait returns once every durable exists, or ctx is done.
func (p *provisioned) wait(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) {
	ticker := time.NewTicker(provisionPoll)
	defer ticker.Stop()
	logged := false
	for _, sub := range p.subs {
		stream := streamOf(p.topology, sub.Durable)
		for {
			_, err := js.Consumer(ctx, stream, sub.Durable)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			p.setMissing(sub, err)
			if !logged {
				logger.WarnContext(ctx, "durable consumer missing; waiting for `onceflow provision`",
					"stream", stream, "consumer", sub.Durable, "err", err)
				logged = true
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}
	p.missing.Store(nil)
	if logged {
		logger.InfoContext(ctx, "durable consumers provisioned")
	}
}

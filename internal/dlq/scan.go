package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// scanBatch is how many messages one fetch asks for.
	scanBatch = 500
	// scanInactive is when the server deletes a scan's consumer if this
	// process died before deleting it.
	scanInactive = time.Minute
)

// scanned is one message of a scan.
type scanned struct {
	seq     uint64
	at      time.Time
	subject string
	header  nats.Header
	data    []byte
}

// scan calls f with the messages of st that cfg selects, in order, up to
// the stream's last sequence when the scan began, until f returns false. It
// reads through an ephemeral consumer without acks, deleted afterwards.
func scan(ctx context.Context, st jetstream.Stream, cfg jetstream.ConsumerConfig, f func(scanned) bool) error {
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 || cfg.OptStartSeq > last {
		return nil
	}
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage = true
	cfg.InactiveThreshold = scanInactive
	if cfg.DeliverPolicy == jetstream.DeliverAllPolicy && cfg.OptStartSeq > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
	}
	cons, err := st.CreateConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("scan consumer: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(ctx, cons.CachedInfo().Name)
	}()
	for {
		// The messages are stored: a fetch need not wait for more.
		batch, err := cons.FetchNoWait(scanBatch)
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		n, done := 0, false
		for msg := range batch.Messages() {
			n++
			if done {
				continue // drain the batch
			}
			meta, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			if !f(scanned{seq: meta.Sequence.Stream, at: meta.Timestamp, subject: msg.Subject(), header: msg.Headers(), data: msg.Data()}) {
				done = true
			}
			done = done || meta.Sequence.Stream >= last
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("scan: %w", err)
		}
		if done || n == 0 {
			return nil
		}
	}
}

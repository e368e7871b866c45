// Package streamscan reads what a JetStream stream holds, in order, without
// disturbing it: the auditor's and the DLQ tool's view of a stream.
package streamscan

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// batch is how many messages one fetch asks for.
	batch = 1000
	// inactive is when the server deletes a scan's consumer if this
	// process died before deleting it.
	inactive = time.Minute
	// unanswered bounds how long a scan waits for a consumer to answer:
	// on a cluster, one just created or whose node was just cut off or
	// restarted has no responders for a while.
	unanswered = 30 * time.Second
	// retryWait is the pause between two unanswered fetches.
	retryWait = 200 * time.Millisecond
)

// Message is one stored message.
type Message struct {
	Seq     uint64
	At      time.Time
	Subject string
	Header  nats.Header
	Data    []byte
}

// Scan calls f with the messages of st that cfg selects, in stream order, up
// to the stream's last sequence when the scan began, until f returns false.
//
// It reads through an ordered consumer: an in-memory R1 consumer without
// acks that the client recreates, from the sequence after the last one
// read, when it stops answering. So a leader change or a node restart on a
// cluster costs a pause, never a message read twice or skipped.
func Scan(ctx context.Context, st jetstream.Stream, cfg jetstream.OrderedConsumerConfig, f func(Message) bool) error {
	_, err := ScanAtMost(ctx, st, cfg, 0, f)
	return err
}

// ScanAtMost is Scan for a stream of at most limit messages (0: any): it
// returns false, without scanning, when st holds more.
func ScanAtMost(ctx context.Context, st jetstream.Stream, cfg jetstream.OrderedConsumerConfig, limit uint64, f func(Message) bool) (bool, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("scan: %w", err)
	}
	last := info.State.LastSeq
	switch {
	case limit > 0 && info.State.Msgs > limit:
		return false, nil
	case info.State.Msgs == 0 || cfg.OptStartSeq > last:
		return true, nil
	}
	if cfg.DeliverPolicy == jetstream.DeliverAllPolicy && cfg.OptStartSeq > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
	}
	cfg.InactiveThreshold = inactive
	cfg.MaxResetAttempts = 5 // the client's backoff: about 25 s
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("scan consumer: %w", err)
	}
	defer func() {
		info := cons.CachedInfo()
		if info == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(ctx, info.Name)
	}()
	if err := read(ctx, cons, last, unanswered, f); err != nil {
		return false, err
	}
	return true, nil
}

// read fetches from cons into f until the scan is done, waiting out
// unanswered fetches for up to patience.
func read(ctx context.Context, cons jetstream.Consumer, last uint64, patience time.Duration, f func(Message) bool) error {
	var quietSince time.Time // since when fetches go unanswered
	for {
		done, err := fetch(ctx, cons, last, f)
		switch {
		case err == nil && done:
			return nil
		case err == nil:
			quietSince = time.Time{}
			continue
		case !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, errUnfinished):
			return fmt.Errorf("scan: %w", err)
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) > patience:
			return fmt.Errorf("scan: unanswered for %s: %w", patience, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("scan: %w", context.Cause(ctx))
		case <-time.After(retryWait):
		}
	}
}

// errUnfinished is an empty fetch from a consumer that still has messages
// to give: a fetch that expired unanswered.
var errUnfinished = errors.New("fetch came back empty with messages pending")

// fetch reads one batch into f. It is done when f asked to stop, the batch
// reached last, or the consumer has nothing more to give.
func fetch(ctx context.Context, cons jetstream.Consumer, last uint64, f func(Message) bool) (done bool, err error) {
	b, err := cons.FetchNoWait(batch)
	if err != nil {
		return false, err
	}
	n, stop := 0, false
	for msg := range b.Messages() {
		n++
		if stop {
			continue // drain the batch
		}
		meta, err := msg.Metadata()
		if err != nil {
			return false, err
		}
		m := Message{Seq: meta.Sequence.Stream, At: meta.Timestamp, Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
		stop = !f(m) || m.Seq >= last
	}
	if stop {
		return true, nil
	}
	if err := b.Error(); err != nil {
		return false, err // the next fetch goes on after the last message read
	}
	if n > 0 {
		return false, nil
	}
	// An expired fetch also ends empty and without an error: only the
	// consumer knows whether it had nothing left.
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err
	}
	if info.NumPending > 0 {
		return false, errUnfinished
	}
	return true, nil
}

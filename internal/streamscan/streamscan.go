// Package streamscan reads what a JetStream stream holds, in order, without
// disturbing it: the auditor's and the DLQ tool's view of a stream.
//
// It reads message by message with the stream's message get API
// ($JS.API.STREAM.MSG.GET, answered by the stream's leader), a window of
// them at a time, and creates no consumer. So the identity that reads (the
// operator) needs no right to create consumers, which would let it create
// push consumers delivering onto any subject (nats-server does not check a
// consumer's deliver subject against its creator's permissions). A leader
// change or a node restart on a cluster costs a pause, never a message read
// twice or skipped: a window that goes unanswered is asked for again.
package streamscan

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/streams"
)

const (
	// window is how many messages are asked for at once.
	window = 64
	// unanswered bounds how long a scan waits for the stream to answer:
	// on a cluster, a stream whose leader was just cut off or restarted
	// has no responders for a while.
	unanswered = 30 * time.Second
	// retryWait is the pause between two unanswered windows.
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

// Range is what a scan reads: the messages from sequence From on (the
// stream's first when 0) whose subject matches Subject (every one when
// empty; NATS wildcards allowed).
type Range struct {
	From    uint64
	Subject string
}

// Scan calls f with the messages of st that r selects, in stream order, up
// to the stream's last sequence when the scan began, until f returns false.
func Scan(ctx context.Context, st jetstream.Stream, r Range, f func(Message) bool) error {
	_, err := ScanAtMost(ctx, st, r, 0, f)
	return err
}

// ScanAtMost is Scan for a stream of at most limit messages (0: any): it
// returns false, without scanning, when st holds more.
func ScanAtMost(ctx context.Context, st jetstream.Stream, r Range, limit uint64, f func(Message) bool) (bool, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("scan: %w", err)
	}
	switch {
	case limit > 0 && info.State.Msgs > limit:
		return false, nil
	case info.State.Msgs == 0:
		return true, nil
	}
	from := max(r.From, info.State.FirstSeq)
	if err := read(ctx, st, from, info.State.LastSeq, r.Subject, unanswered, f); err != nil {
		return false, err
	}
	return true, nil
}

// getter is the part of a jetstream.Stream a scan reads through.
type getter interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

// read gets the messages from from to last into f, a window at a time,
// waiting out unanswered windows for up to patience.
func read(ctx context.Context, st getter, from, last uint64, subject string, patience time.Duration, f func(Message) bool) error {
	var quietSince time.Time // since when windows go unanswered
	for seq := from; seq <= last; {
		hi := min(seq+window-1, last)
		msgs, err := get(ctx, st, seq, hi)
		switch {
		case err == nil:
			quietSince = time.Time{}
			for _, m := range msgs {
				if m != nil && (subject == "" || streams.SubjectMatches(subject, m.Subject)) &&
					!f(Message{Seq: m.Sequence, At: m.Time, Subject: m.Subject, Header: m.Header, Data: m.Data}) {
					return nil
				}
			}
			seq = hi + 1
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("scan: %w", context.Cause(ctx))
		case !unansweredErr(err):
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
	return nil
}

// get gets the messages lo to hi, at once; a sequence that holds none (a
// message deleted, or aged out since) is nil.
func get(ctx context.Context, st getter, lo, hi uint64) ([]*jetstream.RawStreamMsg, error) {
	msgs := make([]*jetstream.RawStreamMsg, hi-lo+1)
	g, gctx := errgroup.WithContext(ctx)
	for i := range msgs {
		g.Go(func() error {
			m, err := st.GetMsg(gctx, lo+uint64(i))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil
			}
			msgs[i] = m
			return err
		})
	}
	return msgs, g.Wait()
}

// unansweredErr reports whether err is a request nobody answered in time,
// worth asking again.
func unansweredErr(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &apiErr) && apiErr.Code == 503 // no leader yet
}

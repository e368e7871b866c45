package streamscan

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestReadThroughUnansweredGets gives the scan what a cluster gives it
// while a stream's leader moves: gets that nobody answers, or that time
// out. The scan waits them out and reads every message once, in order.
func TestReadThroughUnansweredGets(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "UNANSWERED", Subjects: []string{"unanswered.>"}})
	require.NoError(t, err)
	const n = 2*window + 10
	for i := 1; i <= n; i++ {
		_, err := js.PublishAsync("unanswered.x", fmt.Appendf(nil, "%d", i))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	for _, fault := range []error{nats.ErrNoResponders, nats.ErrTimeout, context.DeadlineExceeded} {
		t.Run(fault.Error(), func(t *testing.T) {
			s := &faultyStream{getter: st, after: window, faults: 3 * window, fault: fault}
			var seqs []uint64
			err := read(ctx, s, 1, n, "", unanswered, func(m Message) bool {
				require.Equal(t, fmt.Sprint(m.Seq), string(m.Data))
				seqs = append(seqs, m.Seq)
				return true
			})
			require.NoError(t, err)
			require.Zero(t, s.left(), "every fault was given")
			require.Len(t, seqs, n)
			for i, seq := range seqs {
				require.Equal(t, uint64(i+1), seq)
			}
		})
	}
}

// TestReadGivesUpOnAStreamThatNeverAnswers: a scan waits out unanswered
// gets for its patience, then fails, within a small multiple of it; any
// other error fails it at once.
func TestReadGivesUpOnAStreamThatNeverAnswers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SILENT", Subjects: []string{"silent.>"}})
	require.NoError(t, err)
	for range 2 {
		_, err = js.Publish(ctx, "silent.x", nil)
		require.NoError(t, err)
	}

	const patience = 500 * time.Millisecond
	s := &faultyStream{getter: st, faults: 1 << 30, fault: nats.ErrNoResponders}
	start := time.Now()
	err = read(ctx, s, 1, 2, "", patience, func(Message) bool { return true })
	waited := time.Since(start)
	require.Error(t, err)
	require.Contains(t, err.Error(), "unanswered for")
	require.GreaterOrEqual(t, waited, patience)
	require.Less(t, waited, 5*patience, "the wait is bounded by the patience")

	s = &faultyStream{getter: st, faults: 1, fault: jetstream.ErrStreamNotFound}
	err = read(ctx, s, 1, 2, "", patience, func(Message) bool { return true })
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

// faultyStream answers its first after gets, then gives fault for the
// next faults gets, then answers again.
type faultyStream struct {
	getter
	after, faults int
	fault         error

	mu    sync.Mutex
	calls int
}

func (s *faultyStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	s.mu.Lock()
	s.calls++
	faulty := s.calls > s.after && s.calls <= s.after+s.faults
	s.mu.Unlock()
	if faulty {
		return nil, s.fault
	}
	return s.getter.GetMsg(ctx, seq, opts...)
}

// left is how many faults are still to be given.
func (s *faultyStream) left() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.after+s.faults-s.calls, 0)
}

package streamscan

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestReadThroughUnansweredFetches gives the scan what a busy server or a
// cluster gives it between two full batches: fetches that come back empty
// (an expired fetch, with messages still pending) and fetches nobody
// answers. The scan waits them out and reads every message; one that took
// an empty fetch for the end of the stream would stop at the first batch.
func TestReadThroughUnansweredFetches(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "UNANSWERED", Subjects: []string{"unanswered.>"}})
	require.NoError(t, err)
	const n = 2 * batch
	for i := 1; i <= n; i++ {
		_, err := js.PublishAsync("unanswered.x", fmt.Appendf(nil, "%d", i))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	tests := []struct {
		name string
		// faults are what the fetches after the first one give instead
		// of messages, in order.
		faults []error
	}{
		{name: "empty fetches", faults: []error{nil, nil}},
		{name: "no responders", faults: []error{nats.ErrNoResponders}},
		{name: "both", faults: []error{nil, nats.ErrNoResponders, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			real, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{InactiveThreshold: inactive})
			require.NoError(t, err)
			cons := &faultyConsumer{Consumer: real, faults: tt.faults}
			var seqs []uint64
			err = read(ctx, cons, n, unanswered, func(m Message) bool {
				seqs = append(seqs, m.Seq)
				return true
			})
			require.NoError(t, err)
			require.Empty(t, cons.faults, "every fault was given")
			require.Len(t, seqs, n)
			for i, seq := range seqs {
				require.Equal(t, uint64(i+1), seq)
			}
		})
	}
}

// TestReadGivesUpOnAConsumerThatNeverAnswers: a scan waits out unanswered
// fetches for its patience, then fails, within a small multiple of it.
func TestReadGivesUpOnAConsumerThatNeverAnswers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SILENT", Subjects: []string{"silent.>"}})
	require.NoError(t, err)
	for range 2 {
		_, err = js.Publish(ctx, "silent.x", nil)
		require.NoError(t, err)
	}

	for _, fault := range []error{nil, nats.ErrNoResponders} {
		t.Run(fmt.Sprint(fault), func(t *testing.T) {
			const patience = 500 * time.Millisecond
			silent := make([]error, 1000) // more than a patience's worth of fetches
			for i := range silent {
				silent[i] = fault
			}
			// The first fetch is answered with the first message, so
			// that the consumer exists (an empty fetch asks it whether
			// it is done) and has the second one pending.
			real, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{InactiveThreshold: inactive})
			require.NoError(t, err)
			cons := &faultyConsumer{Consumer: real, faults: silent}
			start := time.Now()
			err = read(ctx, cons, 2, patience, func(Message) bool { return true })
			waited := time.Since(start)
			require.Error(t, err)
			require.Contains(t, err.Error(), "unanswered for")
			require.GreaterOrEqual(t, waited, patience)
			require.Less(t, waited, 5*patience, "the wait is bounded by the patience")
		})
	}
}

// faultyConsumer answers its first fetch with one message, then gives its
// faults one per fetch (nil: an empty batch without an error, as an
// expired fetch ends), then answers again.
type faultyConsumer struct {
	jetstream.Consumer
	fetched bool
	faults  []error
}

func (c *faultyConsumer) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	if !c.fetched {
		c.fetched = true
		return c.Consumer.FetchNoWait(1)
	}
	if len(c.faults) == 0 {
		return c.Consumer.FetchNoWait(n)
	}
	err := c.faults[0]
	c.faults = c.faults[1:]
	if err != nil {
		return nil, err
	}
	return emptyBatch{}, nil
}

type emptyBatch struct{}

func (emptyBatch) Messages() <-chan jetstream.Msg {
	ch := make(chan jetstream.Msg)
	close(ch)
	return ch
}

func (emptyBatch) Error() error { return nil }

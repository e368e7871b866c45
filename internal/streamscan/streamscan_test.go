package streamscan_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streamscan"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestScan reads a stream of more messages than one fetch asks for, so
// that the scan goes through several of its ordered consumer's resets.
func TestScan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCAN", Subjects: []string{"scan.>"}})
	require.NoError(t, err)
	const n = 2500 // 2.5 fetches
	for i := 1; i <= n; i++ {
		subject := "scan.even"
		if i%2 == 1 {
			subject = "scan.odd"
		}
		_, err := js.PublishAsync(subject, fmt.Appendf(nil, "%d", i))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	tests := []struct {
		name string
		cfg  jetstream.OrderedConsumerConfig
		stop uint64   // f returns false at this sequence; 0: never
		want []uint64 // first, last, count
	}{
		{name: "all", want: []uint64{1, n, n}},
		{name: "from a sequence", cfg: jetstream.OrderedConsumerConfig{OptStartSeq: 2001}, want: []uint64{2001, n, n - 2000}},
		{name: "past the end", cfg: jetstream.OrderedConsumerConfig{OptStartSeq: n + 1}, want: nil},
		{name: "filtered", cfg: jetstream.OrderedConsumerConfig{FilterSubjects: []string{"scan.even"}}, want: []uint64{2, n, n / 2}},
		{name: "until f stops", stop: 1500, want: []uint64{1, 1500, 1500}},
		{name: "headers only", cfg: jetstream.OrderedConsumerConfig{HeadersOnly: true}, want: []uint64{1, n, n}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seqs []uint64
			err := streamscan.Scan(ctx, st, tt.cfg, func(m streamscan.Message) bool {
				if len(seqs) > 0 {
					require.Greater(t, m.Seq, seqs[len(seqs)-1], "in order, each once")
				}
				if !tt.cfg.HeadersOnly {
					require.Equal(t, fmt.Sprint(m.Seq), string(m.Data))
				}
				seqs = append(seqs, m.Seq)
				return m.Seq != tt.stop
			})
			require.NoError(t, err)
			if tt.want == nil {
				require.Empty(t, seqs)
				return
			}
			require.Equal(t, tt.want, []uint64{seqs[0], seqs[len(seqs)-1], uint64(len(seqs))})
		})
	}

	ok, err := streamscan.ScanAtMost(ctx, st, jetstream.OrderedConsumerConfig{}, n-1, func(streamscan.Message) bool {
		t.Error("a stream past the limit is not scanned")
		return false
	})
	require.NoError(t, err)
	require.False(t, ok)

	// The scan leaves no consumer behind (the client deletes those it
	// replaced in the background).
	require.Eventually(t, func() bool {
		names := st.ConsumerNames(ctx)
		n := 0
		for range names.Name() {
			n++
		}
		return names.Err() == nil && n == 0
	}, 10*time.Second, 50*time.Millisecond)
}

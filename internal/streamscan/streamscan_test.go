package streamscan_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streamscan"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestScan reads a stream of more messages than a window holds, with
// gaps (deleted messages), and leaves no consumer behind: it creates none.
func TestScan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.NewNATS(t).JetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCAN", Subjects: []string{"scan.>"}})
	require.NoError(t, err)
	const n = 2500 // many windows
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
	for _, seq := range []uint64{3, 64, 65, 1000} { // a gap, and one across two windows
		require.NoError(t, st.DeleteMsg(ctx, seq))
	}
	deleted := func(seq uint64) bool { return seq == 3 || seq == 64 || seq == 65 || seq == 1000 }

	tests := []struct {
		name string
		r    streamscan.Range
		stop uint64   // f returns false at this sequence; 0: never
		want []uint64 // first, last, count
	}{
		{name: "all", want: []uint64{1, n, n - 4}},
		{name: "from a sequence", r: streamscan.Range{From: 2001}, want: []uint64{2001, n, n - 2000}},
		{name: "past the end", r: streamscan.Range{From: n + 1}, want: nil},
		{name: "filtered", r: streamscan.Range{Subject: "scan.even"}, want: []uint64{2, n, n/2 - 2}},
		{name: "wildcard", r: streamscan.Range{Subject: "scan.*"}, want: []uint64{1, n, n - 4}},
		{name: "until f stops", stop: 1500, want: []uint64{1, 1500, 1500 - 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seqs []uint64
			err := streamscan.Scan(ctx, st, tt.r, func(m streamscan.Message) bool {
				if len(seqs) > 0 {
					require.Greater(t, m.Seq, seqs[len(seqs)-1], "in order, each once")
				}
				require.False(t, deleted(m.Seq), "a deleted message")
				require.Equal(t, fmt.Sprint(m.Seq), string(m.Data))
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

	ok, err := streamscan.ScanAtMost(ctx, st, streamscan.Range{}, n-5, func(streamscan.Message) bool {
		t.Error("a stream past the limit is not scanned")
		return false
	})
	require.NoError(t, err)
	require.False(t, ok)

	names := st.ConsumerNames(ctx)
	for name := range names.Name() {
		t.Errorf("the scan created consumer %s", name)
	}
	require.NoError(t, names.Err())
}

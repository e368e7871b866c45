package inbox

import (
	"testing"
	"time"
)

func TestNakDelayDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		delivered uint64
		want      time.Duration
	}{
		{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second},
		{6, 32 * time.Second}, {7, maxNakDelay}, {50, maxNakDelay},
	}
	for _, tt := range tests {
		if got := nakDelay(time.Second, tt.delivered); got != tt.want {
			t.Errorf("nakDelay(1s, %d) = %v, want %v", tt.delivered, got, tt.want)
		}
	}
}

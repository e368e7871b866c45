package httpapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// Each caller has a bucket of their own; the rest wait the time their
// next token needs, and are not charged for being refused.
func TestCallerLimits(t *testing.T) {
	t.Parallel()
	now := time.Now()
	l := &callerLimits{limit: rate.Limit(0.5), burst: 2, max: 3, callers: map[string]*rate.Limiter{}}
	require.Zero(t, l.take("alice", now))
	require.Zero(t, l.take("alice", now))
	for range 3 {
		require.InDelta(t, 2*time.Second, l.take("alice", now), float64(time.Millisecond), "a token every 2s")
	}
	require.Zero(t, l.take("bob", now), "bob's bucket is his own")
	require.Zero(t, l.take("alice", now.Add(2*time.Second)), "refused requests took nothing")

	// Full, the map forgets whoever has refilled, and else everyone.
	require.Zero(t, l.take("carol", now))
	require.Zero(t, l.take("dave", now))
	require.Len(t, l.callers, 1, "none had refilled: all forgotten but dave")
	require.Zero(t, l.take("erin", now))
	require.Zero(t, l.take("frank", now.Add(time.Second)))
	require.Zero(t, l.take("grace", now.Add(time.Hour)))
	require.Equal(t, []string{"grace"}, keys(l.callers), "the refilled were forgotten")
}

func keys(m map[string]*rate.Limiter) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

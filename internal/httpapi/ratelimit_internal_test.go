package httpapi

import (
	"fmt"
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
	l := newCallerLimits(rate.Limit(0.5), 2, 3)
	require.Zero(t, l.take("alice", now))
	require.Zero(t, l.take("alice", now))
	for range 3 {
		require.InDelta(t, 2*time.Second, l.take("alice", now), float64(time.Millisecond), "a token every 2s")
	}
	require.Zero(t, l.take("bob", now), "bob's bucket is his own")
	require.Zero(t, l.take("alice", now.Add(2*time.Second)), "refused requests took nothing")
}

// A full set of buckets forgets the caller least recently seen, never
// everyone: a caller being limited stays limited however many made-up
// callers come by between their requests, up to the bound.
func TestCallerLimitsForgetTheLeastRecentOnly(t *testing.T) {
	t.Parallel()
	now := time.Now()
	l := newCallerLimits(rate.Limit(0.001), 1, 100)
	require.Zero(t, l.take("mallory", now))
	for i := range 10_000 {
		require.Zero(t, l.take(fmt.Sprint("made-up-", i), now), "a new caller has a full bucket")
		if i%50 == 0 {
			require.Positive(t, l.take("mallory", now), "mallory is still limited after %d others", i+1)
		}
	}
	require.Equal(t, 100, l.callers.Len(), "bounded")
	require.Zero(t, l.take("mallory", now.Add(time.Hour)), "her bucket refills with time")
}

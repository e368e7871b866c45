package auth

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestCacheKeepsTokensUntilTheyExpire(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newCache(2)
	c.put("a", Identity{Subject: "alice", Expires: now.Add(time.Minute)})

	id, ok := c.get("a", now.Add(59*time.Second))
	assert.True(t, ok)
	assert.Equal(t, "alice", id.Subject)
	_, ok = c.get("a", now.Add(time.Minute))
	assert.False(t, ok, "an expired token is verified again, and refused")
	_, ok = c.get("b", now)
	assert.False(t, ok)

	off := newCache(0)
	off.put("a", Identity{Expires: now.Add(time.Hour)})
	_, ok = off.get("a", now)
	assert.False(t, ok)
}

// A full cache drops the token least recently used, and only that one: the
// tokens in use stay cached however many others come by.
func TestCacheDropsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newCache(3)
	live := Identity{Expires: now.Add(time.Hour)}
	c.put("busy", live)
	for i := range 1000 {
		c.put(fmt.Sprint(i), live)
		_, ok := c.get("busy", now)
		assert.True(t, ok, "after %d others", i+1)
	}
	assert.Equal(t, 3, c.entries.Len())
	_, ok := c.get("0", now)
	assert.False(t, ok)
	_, ok = c.get("999", now)
	assert.True(t, ok)
}

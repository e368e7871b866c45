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
	c.put("a", Identity{Subject: "alice", Expires: now.Add(time.Minute)}, now)

	id, ok := c.get("a", now.Add(59*time.Second))
	assert.True(t, ok)
	assert.Equal(t, "alice", id.Subject)
	_, ok = c.get("a", now.Add(time.Minute))
	assert.False(t, ok, "an expired token is verified again, and refused")
	_, ok = c.get("b", now)
	assert.False(t, ok)

	// A full cache makes room: expired entries first, else everything.
	c.put("old", Identity{Expires: now.Add(time.Second)}, now)
	c.put("live", Identity{Expires: now.Add(time.Hour)}, now)
	c.put("new", Identity{Expires: now.Add(time.Hour)}, now.Add(2*time.Second))
	_, ok = c.get("live", now.Add(2*time.Second))
	assert.True(t, ok)
	for i := range 3 {
		c.put(fmt.Sprint(i), Identity{Expires: now.Add(time.Hour)}, now)
	}
	assert.LessOrEqual(t, len(c.entries), 2)

	off := newCache(0)
	off.put("a", Identity{Expires: now.Add(time.Hour)}, now)
	_, ok = off.get("a", now)
	assert.False(t, ok)
}

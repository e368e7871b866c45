package auth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// cache keeps the identities of verified tokens until the tokens expire,
// keyed by the tokens' SHA-256, so that a client's next request with the
// same token skips the signature check (an RS256 verification costs about
// 100µs of CPU; a hash of a token about 1µs). A token is never cached
// beyond its exp, so caching does not lengthen any token's life; it does
// mean that a key removed from the JWKS stops its cached tokens only at
// their expiry, as with most resource servers.
type cache struct {
	max int

	mu      sync.Mutex
	entries map[[sha256.Size]byte]Identity
}

func newCache(size int) *cache {
	if size <= 0 {
		return nil
	}
	return &cache{max: size, entries: make(map[[sha256.Size]byte]Identity, size)}
}

// get returns the identity of token if it was verified and has not expired.
func (c *cache) get(token string, now time.Time) (Identity, bool) {
	if c == nil {
		return Identity{}, false
	}
	k := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.entries[k]
	if !ok {
		return Identity{}, false
	}
	if !now.Before(id.Expires) {
		delete(c.entries, k)
		return Identity{}, false
	}
	return id, true
}

// put records that token was verified as id. A full cache drops its
// expired entries, and all of them if none has expired: simpler than LRU,
// and a cache that fills with live tokens is only a cache that misses.
func (c *cache) put(token string, id Identity, now time.Time) {
	if c == nil {
		return
	}
	k := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.Expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			clear(c.entries)
		}
	}
	c.entries[k] = id
}

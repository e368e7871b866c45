package auth

import (
	"crypto/sha256"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// cache keeps the identities of verified tokens until the tokens expire,
// keyed by the tokens' SHA-256, so that a client's next request with the
// same token skips the signature check (an RS256 verification costs about
// 100µs of CPU; a hash of a token about 1µs). A token is never cached
// beyond its exp, so caching does not lengthen any token's life; it does
// mean that a key removed from the JWKS stops its cached tokens only at
// their expiry, as with most resource servers.
//
// Its memory is bounded: at most its size of entries, the least recently
// used dropped first, each a hash and an Identity, whose subject and
// e-mail Verify bounds (maxSubjectLength, MaxEmailLength): under 600 bytes,
// some 6 MB for the default 10,000.
type cache struct {
	entries *lru.Cache[[sha256.Size]byte, Identity]
}

// newCache is a cache of size tokens, or nil (no cache) for size 0 or less.
func newCache(size int) *cache {
	if size <= 0 {
		return nil
	}
	entries, err := lru.New[[sha256.Size]byte, Identity](size)
	if err != nil {
		return nil // only for a size below 1, refused above
	}
	return &cache{entries: entries}
}

// get returns the identity of token if it was verified and has not expired.
func (c *cache) get(token string, now time.Time) (Identity, bool) {
	if c == nil {
		return Identity{}, false
	}
	k := sha256.Sum256([]byte(token))
	id, ok := c.entries.Get(k)
	if !ok {
		return Identity{}, false
	}
	if !now.Before(id.Expires) {
		c.entries.Remove(k)
		return Identity{}, false
	}
	return id, true
}

// put records that token was verified as id; a full cache drops its least
// recently used token, which is verified again at its next request.
func (c *cache) put(token string, id Identity) {
	if c == nil {
		return
	}
	c.entries.Add(sha256.Sum256([]byte(token)), id)
}

package oidctoken

import (
	"crypto/sha256"
	"sync"
	"time"
)

// entry is a verified token: who holds it, and the key that signed it,
// which must still be published for the entry to count.
type entry struct {
	id  Identity
	iss *issuer
	kid string
}

// cache remembers verified tokens by their SHA-256, up to size of them.
type cache struct {
	mu      sync.RWMutex
	size    int
	entries map[[sha256.Size]byte]entry
}

func newCache(size int) *cache {
	return &cache{size: size, entries: make(map[[sha256.Size]byte]entry)}
}

func (c *cache) get(k [sha256.Size]byte) (entry, bool) {
	c.mu.RLock()
	e, ok := c.entries[k]
	c.mu.RUnlock()
	return e, ok
}

func (c *cache) remove(k [sha256.Size]byte) {
	c.mu.Lock()
	delete(c.entries, k)
	c.mu.Unlock()
}

// put remembers e. When the cache is full it first drops expired tokens,
// then, if still full, an eighth of the others (map order: arbitrary), so
// that a flood of distinct tokens costs each a full verification but never
// unbounded memory.
func (c *cache) put(k [sha256.Size]byte, e entry, now time.Time, skew time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.size {
		for key, old := range c.entries {
			if !now.Before(old.id.Expiry.Add(skew)) {
				delete(c.entries, key)
			}
		}
		drop := len(c.entries) - c.size + c.size/8 + 1
		for key := range c.entries {
			if drop <= 0 {
				break
			}
			delete(c.entries, key)
			drop--
		}
	}
	c.entries[k] = e
}

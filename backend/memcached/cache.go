package memcached

import "sync"

// headCache remembers, per pair, the reset-at this process last read from
// (or wrote to) the head, and the caller's now when it did, so that a Take
// inside an open window can go straight to the counter: one round trip
// instead of two. An entry is trusted while the window is open and for
// Options.CacheFor of the callers' time after the read, in either
// direction (callers' nows are not ordered); then the head is read again.
//
// It holds at most about size entries in two generations: when the current
// one is full it becomes the previous one and the old previous one is
// dropped, so the cost of bounding it is O(1) per insert and the pairs in
// use stay cached.
type headCache struct {
	mu        sync.Mutex
	cur, prev map[string]cachedHead
	size      int   // entries per generation
	ttl       int64 // ms
}

type cachedHead struct {
	resetAt int64 // ms
	readAt  int64 // caller's now, ms
}

func newHeadCache(entries int, ttlMs int64) *headCache {
	n := max(entries/2, 1)
	return &headCache{cur: make(map[string]cachedHead, n), size: n, ttl: ttlMs}
}

// get returns the cached reset-at of the head key if it can be trusted at nowMs.
func (c *headCache) get(key string, nowMs int64) (int64, bool) {
	c.mu.Lock()
	h, ok := c.cur[key]
	if !ok {
		h, ok = c.prev[key]
	}
	c.mu.Unlock()
	if !ok || h.resetAt <= nowMs || nowMs-h.readAt >= c.ttl || h.readAt-nowMs >= c.ttl {
		return 0, false
	}
	return h.resetAt, true
}

func (c *headCache) put(key string, resetAt, nowMs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.cur[key]; !ok && len(c.cur) >= c.size {
		c.prev, c.cur = c.cur, make(map[string]cachedHead, c.size)
	}
	c.cur[key] = cachedHead{resetAt: resetAt, readAt: nowMs}
}

func (c *headCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cur, key)
	delete(c.prev, key)
}

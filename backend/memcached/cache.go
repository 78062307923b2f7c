package memcached

import "sync"

// headCache remembers, per pair, the reset-at this process last read from
// (or wrote to) the head, and the caller's now when it did, so that a Take
// inside an open window can go straight to the counter: one round trip
// instead of two. An entry is trusted for Options.CacheFor of the callers'
// time after the read, in either direction (callers' nows are not
// ordered), and only while more than CacheFor of the window is left (see
// trusted); then the head is read again.
//
// Untrusted entries still serve as hints: the counter key to fetch along
// with the head, at most once per fetchEvery of the callers' time (a
// multi-key get costs a goroutine in gomemcache). With Options.NoCache the
// ttl is 0 and nothing is trusted.
//
// It holds at most about size entries in two generations: when the current
// one is full it becomes the previous one and the old previous one is
// dropped, so the cost of bounding it is O(1) per insert and the pairs in
// use stay cached.
type headCache struct {
	mu         sync.Mutex
	cur, prev  map[string]cachedHead
	size       int   // entries per generation
	ttl        int64 // ms
	fetchEvery int64 // ms
}

type cachedHead struct {
	resetAt   int64 // ms
	readAt    int64 // caller's now, ms
	fetchedAt int64 // caller's now when the counter was last fetched, ms
	fetched   bool  // fetchedAt is set
}

func newHeadCache(entries int, ttlMs, fetchEveryMs int64) *headCache {
	n := max(entries/2, 1)
	return &headCache{cur: make(map[string]cachedHead, n), size: n, ttl: ttlMs, fetchEvery: fetchEveryMs}
}

// get returns what is cached for the head key, trusted or not.
func (c *headCache) get(key string) (cachedHead, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.cur[key]
	if !ok {
		h, ok = c.prev[key]
	}
	return h, ok
}

// trusted reports whether h can stand for the head at nowMs: only while
// the window has more than ttl left. The head is replaced by a call whose
// now has reached the reset-at, so a process whose clock is up to ttl ahead
// of this caller's may already have opened the next window; the contract
// counts this caller's call there (the stored window is open at its now),
// and only a read of the head finds it.
func (c *headCache) trusted(h cachedHead, nowMs int64) bool {
	return h.resetAt-nowMs > c.ttl && nowMs-h.readAt < c.ttl && h.readAt-nowMs < c.ttl
}

// needsFetch reports whether the counter should be fetched with the head.
func (c *headCache) needsFetch(h cachedHead, nowMs int64) bool {
	return !h.fetched || nowMs-h.fetchedAt >= c.fetchEvery || h.fetchedAt-nowMs >= c.fetchEvery
}

// put records a head read or written at nowMs; fetched says the window's
// counter was fetched with it.
func (c *headCache) put(key string, resetAt, nowMs int64, fetched bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.cur[key]
	if !ok {
		old, ok = c.prev[key]
		if len(c.cur) >= c.size {
			c.prev, c.cur = c.cur, make(map[string]cachedHead, c.size)
		}
	}
	h := cachedHead{resetAt: resetAt, readAt: nowMs}
	switch {
	case fetched:
		h.fetchedAt, h.fetched = nowMs, true
	case ok && old.resetAt == resetAt:
		h.fetchedAt, h.fetched = old.fetchedAt, old.fetched
	}
	c.cur[key] = h
}

func (c *headCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cur, key)
	delete(c.prev, key)
}

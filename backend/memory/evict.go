package memory

import (
	"math"
	"math/bits"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// Eviction: a shard holds at most its share of Options.MaxKeys states.
// When it is full, a new state first takes the place of one that ended (a
// sweep, at most once per quarter of the shard's share of evictions), else
// of a live state seldom used. A hand walks the slots. A state made by one
// call and not called since (a flood's key) goes first: the hand evicts
// the first such state within probation slots of it, passing the others
// untouched, so a flood of keys seen once cycles through the table without
// wearing down the clients that call again. When there is none that near,
// the hand works as a CLOCK: it takes one from each state's count of calls
// (up to maxUses) and evicts the first with none.
// An evicted state is not forgotten: the shard's second tier, an array of
// cells addressed by a hash of (key, policy), remembers what it counted and
// until when, merged with whatever the cell already holds, keeping the
// stricter of each (more units, later end). A call that finds no state
// looks there first: a cell that vouches for its (key, policy) is the
// state it answers from. So the second tier may over-count (a cell shared
// by several evicted states answers for each with the most any counted,
// until the latest end), never under-count, and an evicted key that
// returns is never handed a fresh window.
//
// A cell holds the latest end (Unix ms), two counts, the hash of its owner
// while one (key, policy) alone wrote it, and a mask of the fingerprints
// of the states merged into it: a state whose fingerprint bits are not all
// in the mask was never merged there, so a new key reads a cell shared by
// other keys only when its three bits happen to be set (about 0.2% of new
// keys with 2 states merged into a cell, 5% with 10). Two (key, policy)
// pairs with the same 64-bit hash would share a cell as its owner: the
// second tier is keyed by a hash.
// Each algorithm stores and rebuilds its state as follows, every rebuild
// answering at least as strictly as the state evicted:
//
//   - fixed window: the units counted and the ResetAt: exact;
//   - token bucket: when it is full again; rebuilt as refilling linearly
//     to full then, at most one ms of refill short of the evicted bucket;
//   - sliding-window counter: the current and previous counts and the end
//     of the pair, (K+2)·Window: exact;
//   - sliding log: the units of every entry held, as one entry that ends
//     when the newest did: a returning client waits for its newest entry
//     to end to get any of them back.
//
// Concurrency limits (leases) are never evicted: a shard full of them
// refuses a new one with ErrFull.
type tier struct {
	cells []cell
	// until is the latest end of any cell: once the trusted clock passes
	// it, every cell has ended and the array goes.
	until int64
}

type cell struct {
	until int64  // Unix ms when the merged states have all ended; 0: empty
	a, b  uint32 // the counts (see remember); allCounted: more than fits
	mask  uint64 // the fingerprint bits of the states merged in
	// owner is the hash of the one (key, policy) whose state the cell
	// holds alone, 0 once states of two were merged: that state is exact,
	// and the owner's next one replaces it (the table held the owner's
	// newer state, as a table without bound would).
	owner uint64
}

// allCounted marks a count too large for a cell: it rebuilds as the whole
// capacity, so a cell never under-counts.
const allCounted = math.MaxUint32

func count32(n int64) uint32 {
	if n >= allCounted {
		return allCounted
	}
	return uint32(max(n, 0))
}

func uncount(n uint32, limit int64) int64 {
	if n == allCounted {
		return limit
	}
	return min(int64(n), limit)
}

// tierKey is where (key, policy) lives in the second tier: a hash of the
// key's hash and the policy's identity, whose low 32 bits pick the cell and
// whose high bits are the fingerprint (three of 64 mask bits).
func tierKey(h uint32, id uint32) (hash, fp uint64) {
	x := (uint64(id)<<32 | uint64(h)) * 0x9e3779b97f4a7c15
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return x, 1<<(x>>58) | 1<<((x>>52)&63) | 1<<((x>>46)&63)
}

// tierCells is the size of a shard's second tier: two cells per state the
// shard may hold, so that a flood's evicted states share cells with few
// others.
func tierCells(quota int) int { return 2 * quota }

// remember merges the state of slot w, about to be evicted, into the
// locked shard's second tier.
func (b *Backend) remember(s *shard, w *slot) {
	var until int64
	var a, c uint32
	switch w.kind() {
	case kindFixed:
		until, a = w.resetAt, count32(w.used)
	case kindBucket:
		until = w.end
	case kindCounter:
		until, a, c = w.ends(), count32(w.used), count32(w.prev)
	case kindLog:
		// Every entry's units, live or not yet dropped: a Peek under a
		// window that keeps them all.
		d, _ := s.table.extraOf(w).log.Apply(throttler.Policy{Limit: throttler.MaxLogLimit, Window: 1 << 62}, throttler.OpPeek, 1, 0, 0)
		until, a = w.end, count32(d.Used)
	}
	if s.tier.cells == nil {
		s.tier.cells = make([]cell, tierCells(b.quota))
	}
	hash, fp := tierKey(w.hash, w.id)
	owner := hash | 1 // never 0
	x := &s.tier.cells[home(uint32(hash), len(s.tier.cells))]
	if x.until <= s.ref || x.owner == owner {
		// Ended by the last sweep's reference (what it held answers like
		// none for every call a sweep would have kept state for), or this
		// state's own older one.
		*x = cell{owner: owner}
	} else {
		x.owner = 0
	}
	x.until, x.a, x.b, x.mask = max(x.until, until), max(x.a, a), max(x.b, c), x.mask|fp
	s.tier.until = max(s.tier.until, x.until)
	s.evictions++
}

// recall returns the state the locked shard's second tier remembers for
// (key, p), whose identity number is id, at t (Unix ms), as a slot that is
// not in the table (and a log's buffer), or false. With take set the state
// goes back to the table: a cell the (key, p) owns is emptied.
func (b *Backend) recall(s *shard, h uint64, id uint32, p *throttler.Policy, t int64, take bool) (slot, *algo.LogBuffer, bool) {
	if s.tier.cells == nil {
		return slot{}, nil, false
	}
	hash, fp := tierKey(uint32(h), id)
	i := home(uint32(hash), len(s.tier.cells))
	x := s.tier.cells[i]
	if x.until <= t || x.mask&fp != fp || x.owner != 0 && x.owner != hash|1 {
		return slot{}, nil, false
	}
	w := slot{hash: uint32(h), id: id, meta: kindOf(p.Algorithm) << 5}
	var lg *algo.LogBuffer
	wms := p.Window.Milliseconds()
	switch p.Algorithm {
	case throttler.FixedWindow:
		w.used, w.resetAt, w.end = uncount(x.a, p.Limit), x.until, x.until
	case throttler.TokenBucket:
		// Full at until, refilling Limit scaled units a ms until then.
		full := p.Capacity() * wms
		tokens := int64(0)
		if hi, lo := bits.Mul64(uint64(x.until-t), uint64(p.Limit)); hi == 0 && lo < uint64(full) {
			tokens = full - int64(lo)
		}
		w.used, w.resetAt, w.prev, w.end = tokens, t, wms, x.until
	case throttler.SlidingWindow:
		k := x.until / wms
		if x.until%wms < 0 {
			k--
		}
		w.resetAt, w.used, w.prev, w.end = k-2, uncount(x.a, p.Limit), uncount(x.b, p.Limit), wms // end: the window
	case throttler.SlidingLog:
		lg = new(algo.LogBuffer)
		if n := uncount(x.a, p.Limit); n > 0 {
			lg.Apply(*p, throttler.OpTake, n, 0, x.until-wms)
		}
		w.end = lg.End(*p)
	}
	if take && x.owner == hash|1 {
		s.tier.cells[i] = cell{}
	}
	s.tierHits++
	return w, lg, true
}

// A slot's uses: calledAgain once a call found the state (or it came
// back from the second tier), and below it the count of calls since the
// hand last passed, capped at maxUses: a client that stops calling is
// evicted after the CLOCK has passed it that many times.
const (
	calledAgain = 0x80
	maxUses     = 3
)

// probation bounds how far the hand looks for a state made by one call and
// not called since, before it falls back to the CLOCK.
const probation = 64

// used1 counts a call on the slot for eviction.
func (w *slot) used1() {
	w.uses = calledAgain | min(w.uses&^calledAgain+1, maxUses)
}

// room counts a new state in the locked shard s against the bounds, a
// shard's share of MaxKeys and MaxKeys itself (exactly, under any
// concurrency), evicting from s to make room. When s has nothing to evict
// (it holds only leases, or nothing), the state goes in above s's share if
// MaxKeys allows, else a state is evicted from another shard no one holds
// (TryLock: never waiting, so no lock order to keep). When nothing can be
// evicted anywhere (only leases are held), a lease is refused (false) and
// a rate limit's state goes in above the bound, so that no call is ever
// admitted without its limit.
func (b *Backend) room(s *shard, ms int64, lease bool) bool {
	for {
		if s.table.live < b.quota && b.take1() {
			return true
		}
		if b.evict(s, ms, true) {
			continue
		}
		if b.take1() {
			return true
		}
		if b.evictElsewhere(s) {
			continue
		}
		if lease {
			return false
		}
		b.keys.Add(1)
		return true
	}
}

// evictElsewhere evicts a state from a shard other than s that no one
// holds, starting from a place that moves on each time.
func (b *Backend) evictElsewhere(s *shard) bool {
	n := len(b.shards)
	start := int(b.elsewhere.Add(1))
	for i := range n {
		o := &b.shards[(start+i)&(n-1)]
		if o == s || !o.mu.TryLock() {
			continue
		}
		ok := b.evict(o, 0, false)
		o.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// take1 counts one more state if MaxKeys allows it.
func (b *Backend) take1() bool {
	for {
		n := b.keys.Load()
		if n >= b.maxKeys {
			return false
		}
		if b.keys.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// evict makes room in the locked shard s (for a call at now, when called
// is set): it drops what has ended if enough evictions passed since the
// last sweep, else moves the least recently used live state to the second
// tier. It reports false when nothing could go (the shard holds only
// leases).
func (b *Backend) evict(s *shard, now int64, called bool) bool {
	if s.sinceSweepEvict >= max(1, b.quota/4) {
		s.sinceSweepEvict = 0
		b.sweep(s, now, called)
		if s.table.live < b.quota {
			return true
		}
	}
	t := &s.table
	n := len(t.slots)
	if t.live == 0 {
		return false
	}
	for k := range probation + (maxUses+1)*n {
		i := s.hand % n
		w := &t.slots[i]
		if w.empty() || w.kind() == kindLease {
			s.hand++
			continue
		}
		if k < probation && w.uses&calledAgain != 0 {
			// Looking for a state seen once; past the probation slots,
			// start the CLOCK from where the hand began.
			if k == probation-1 {
				s.hand -= probation - 1
			} else {
				s.hand++
			}
			continue
		}
		if w.uses&^calledAgain > 0 && k >= probation {
			w.uses--
			s.hand++
			continue
		}
		s.hand++
		b.remember(s, w)
		t.remove(i)
		t.live--
		b.keys.Add(-1)
		s.sinceSweepEvict++
		return true
	}
	return false
}

// forgetEnded drops the locked shard's second tier once every cell in it
// has ended by the shard's reference instant.
func (s *shard) forgetEnded() {
	if s.tier.cells != nil && s.tier.until <= s.ref {
		s.tier = tier{}
	}
}

package memory

import (
	"math"
	"sync"
)

// Cleanup (see the package doc): what a sweep may drop, and who sweeps.

// shard is one lock's share of the table. What every call reads and
// writes comes first, so that a call touches two cache lines of it: the
// lock and the policy memo in the first, the clock sample, the sweep count
// and the table's array in the second.
type shard struct {
	mu   sync.Mutex
	last lastPolicy // the policy of the shard's last call (idents.go)
	// low is the lowest now (Unix ms) of the shard's calls since its last
	// flush into the clock guard, math.MaxInt64 for none, and lowMono the
	// monotonic ms when a call brought it: every call's now reaches the
	// guard before any sweep of the shard trusts a clock, so the state a
	// call made is always vouched for by its own now. Under a clock that
	// moves on, only the first call after a flush is a new low, so the
	// monotonic clock is read about once per sweep, not per call.
	low, lowMono int64
	sinceScan    int // calls since the last sweep
	table        table
	// ref is the last sweep's reference instant, kept when a sweep knows
	// no clock at all.
	ref  int64
	peak int // the most states held since the last sweep
	// Eviction (evict.go): the second tier, the CLOCK hand, evictions
	// since the last sweep, and the counts for Stats.
	tier            tier
	hand            int
	sinceSweepEvict int
	evictions       uint64
	tierHits        uint64
	lastLease       lastPolicy // the concurrency policy of its last lease call (lease.go)
	_               [8]byte    // 320 bytes: shards side by side share no cache line
}

func (s *shard) reset() {
	s.low, s.ref = math.MaxInt64, math.MinInt64
}

// observe records a call at ms in the locked shard s and reports whether
// enough calls have passed to pay for a sweep: at least as many as the
// shard holds, so a sweep costs O(1) per call amortised.
func (b *Backend) observe(s *shard, ms int64) bool {
	if ms < s.low {
		s.low, s.lowMono = ms, b.mono().Milliseconds()
	}
	s.sinceScan++
	return s.sinceScan >= 1024 && s.sinceScan >= s.table.live
}

// sweep drops the locked shard's state that ended by its reference instant
// (see reference; now is the sweeping call's, when called is set), and
// shrinks the table when nothing since the last sweep needed an eighth of
// it. A sweep without a call that leaves nothing releases the table's
// arrays: the shard is idle, and its next state starts a small table.
func (b *Backend) sweep(s *shard, now int64, called bool) {
	s.ref = b.reference(s, now, called)
	s.sinceScan = 0
	b.dropped(s.table.sweep(s.ref))
	if n := len(s.table.slots); !called && s.table.live == 0 {
		s.table.clear()
	} else if n > minSlots && s.peak*8 < n {
		s.table.resize(sizeFor(s.peak))
	}
	s.peak = s.table.live
	s.forgetEnded()
}

// reference is the instant by which a sweep of the locked shard s may drop
// ended state: the callers' clock as the guard trusts it, less Lag, after
// the guard has heard the sweeping call's now (when called is set) and
// the lowest of the shard's calls since its last sweep. Beside a sweeping
// call's own now, that lowest one is forgiven Lag, as a call may trail the
// clock by up to Lag, so a lagging call lowers the trusted clock only by
// as much as it lagged beyond Lag. A sweep without a call (the sweeper's)
// forgives nothing: there the lowest now is the only bound, and forgiving
// it would trust the clock up to Lag ahead of every call, dropping state
// that a call trailing by less than Lag still needs. With no clock known
// the reference stays where it was.
func (b *Backend) reference(s *shard, now int64, called bool) int64 {
	mono := b.mono().Milliseconds()
	off := int64(math.MaxInt64)
	if called {
		off = satSub(now, mono)
	}
	if s.low != math.MaxInt64 {
		low := satSub(s.low, s.lowMono)
		if called {
			low = satAdd(low, b.lag)
		}
		off = min(off, low)
		s.low = math.MaxInt64
	}
	bound := b.guard.bound(mono, off)
	if bound == math.MaxInt64 {
		return s.ref
	}
	return satSub(bound, b.lag)
}

// makeRoom readies the locked shard's crowded table for an insert by a
// call at now: a sweep first, then the array grows by a fifth (up to the
// size the shard's share of MaxKeys needs) unless that freed a fifth of
// it, so that crowding again takes a number of inserts in proportion to
// what the sweep cost. When most calls make new keys, sweeps come from
// here.
func (b *Backend) makeRoom(s *shard, now int64) {
	if len(s.table.slots) > 0 {
		b.sweep(s, now, true)
	}
	if n := len(s.table.slots); n == 0 {
		s.table.resize(minSlots)
	} else if s.table.live*100 > n*64 {
		s.table.resize(max(n+1, min(grown(n), b.quota*5/4+2)))
	}
}

// dropped accounts for n states a sweep dropped.
func (b *Backend) dropped(n int) {
	if n > 0 {
		b.keys.Add(-int64(n))
	}
}

// clockGuard is the callers' clock as cleanup trusts it. Sweeps record
// offsets, a call's now − monotonic time, in epochs of hold of monotonic
// time; the trusted clock is the monotonic time plus the lowest offset of
// the current and the last epoch, and of the last sample of the newest
// epoch before those that has one. So a sample is forgotten only once
// samples taken at least hold later replace it: a clock that steps
// forward raises the offsets it shows, but the lower ones from before the
// step keep the trusted clock moving at real time's pace until the step
// has lasted hold to 2·hold, however long the backend was idle before it.
// A clock that steps back lowers it at once; a lagging call lowers it for
// a while.
type clockGuard struct {
	mu      sync.Mutex
	hold    int64 // Options.ClockHold in ms
	started bool
	start   int64 // monotonic ms when the current epoch began
	// cur and prev are the lowest offsets of the current epoch and the
	// one before; older is the last offset of the newest epoch before
	// them that had one; lastCur and lastPrev the last offsets of cur's
	// and prev's epochs. math.MaxInt64 for none.
	cur, prev, older  int64
	lastCur, lastPrev int64
}

// bound returns the trusted clock (Unix ms) at monotonic time mono, first
// recording the offset off (math.MaxInt64: none); math.MaxInt64 when
// nothing was ever recorded.
func (g *clockGuard) bound(mono, off int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		if off == math.MaxInt64 {
			return math.MaxInt64
		}
		g.started, g.start = true, mono
		g.cur, g.prev, g.older, g.lastCur, g.lastPrev = math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64
	}
	if g.hold > 0 && mono-g.start >= g.hold {
		// Two epochs on or more: what was current becomes the newest
		// epoch before the last one, unless it recorded nothing.
		n := (mono - g.start) / g.hold
		for i := int64(0); i < min(n, 2); i++ {
			if g.lastPrev != math.MaxInt64 {
				g.older = g.lastPrev
			}
			g.prev, g.lastPrev = g.cur, g.lastCur
			g.cur, g.lastCur = math.MaxInt64, math.MaxInt64
		}
		g.start += n * g.hold
	}
	if off != math.MaxInt64 {
		g.cur, g.lastCur = min(g.cur, off), off
	}
	return satAdd(mono, min(g.cur, g.prev, g.older))
}

// satAdd and satSub add and subtract without wrapping: nows are whatever
// callers pass, far past and far future included.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

func satSub(a, b int64) int64 {
	s := a - b
	switch {
	case b < 0 && s < a:
		return math.MaxInt64
	case b > 0 && s > a:
		return math.MinInt64
	}
	return s
}

package memory

import (
	"math"
	"sync"
)

// Cleanup (see the package doc): what a sweep may drop, and who sweeps.

type shard struct {
	mu    sync.Mutex
	table table
	// lows are the lowest nows (Unix ms) of the shard's calls, in turns of
	// lowTurn calls: the current turn's and the last one's, so together
	// the last lowTurn to 2·lowTurn calls; math.MaxInt64 for none. They
	// vouch for a sweeping call's now when the clock guard knows nothing.
	lows  [2]int64
	calls uint // calls ever, to take turns
	// ref is the last sweep's reference instant, kept when a sweep knows
	// no clock at all.
	ref       int64
	sinceScan int      // calls since the last sweep
	peak      int      // the most states held since the last sweep
	_         [40]byte // 128 bytes: shards side by side share no cache line
}

// lowTurn is how many calls a turn of a shard's lowest now lasts.
const lowTurn = 512

func (s *shard) reset() {
	s.lows, s.ref = [2]int64{math.MaxInt64, math.MaxInt64}, math.MinInt64
}

// observe records a call at ms and reports whether enough calls have
// passed to pay for a sweep: at least as many as the shard holds, so a
// sweep costs O(1) per call amortised.
func (s *shard) observe(ms int64) bool {
	if s.calls++; s.calls%lowTurn == 0 {
		s.lows[1], s.lows[0] = s.lows[0], math.MaxInt64
	}
	s.lows[0] = min(s.lows[0], ms)
	s.sinceScan++
	return s.sinceScan >= 1024 && s.sinceScan >= s.table.live
}

// sweep drops the locked shard's state that ended by its reference instant
// (see reference; now is the sweeping call's, when called is set), and
// shrinks the table when nothing since the last sweep needed an eighth of
// it.
func (b *Backend) sweep(s *shard, now int64, called bool) {
	s.ref = b.reference(s, now, called)
	s.sinceScan = 0
	b.dropped(s.table.sweep(s.ref))
	if n := len(s.table.slots); n > minSlots && s.peak*8 < n {
		s.table.resize(sizeFor(s.peak))
	}
	s.peak = s.table.live
}

// reference is the instant by which a sweep of s may drop ended state: the
// callers' clock as the guard trusts it, less Lag. With no clock known it
// stays where it was.
func (b *Backend) reference(s *shard, now int64, called bool) int64 {
	vouched := min(now, s.lows[0], s.lows[1])
	bound := b.guard.bound(b.mono().Milliseconds(), now, vouched, called)
	if bound == math.MaxInt64 {
		return s.ref
	}
	return satSub(bound, b.lag)
}

// makeRoom readies the locked shard's crowded table for an insert by a
// call at now: a sweep first, then the array doubles unless that freed a
// quarter of it, so that crowding again takes as many inserts as the sweep
// cost. When most calls make new keys, sweeps come from here.
func (b *Backend) makeRoom(s *shard, now int64) {
	if len(s.table.slots) > 0 {
		b.sweep(s, now, true)
	}
	if n := len(s.table.slots); n == 0 {
		s.table.resize(minSlots)
	} else if s.table.live*2 > n {
		s.table.resize(2 * n)
	}
}

// dropped accounts for n states a sweep dropped.
func (b *Backend) dropped(n int) {
	if b.maxKeys > 0 && n > 0 {
		b.keys.Add(-int64(n))
	}
}

// reserve counts a new state against MaxKeys, for a call at ms in the
// locked shard s. When the table is full it first sweeps every shard for
// ended state (see reclaim).
func (b *Backend) reserve(s *shard, ms int64) bool {
	if b.take1() {
		return true
	}
	b.reclaim(s, ms)
	return b.take1()
}

// take1 counts one more state if the bound allows it, exactly under any
// concurrency.
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

// fullSweepShare bounds the time a full table spends sweeping for room:
// after a sweep of every shard that took d, the next waits 19·d, so a flood
// of new keys costs at most a twentieth of a core in sweeps.
const fullSweepShare = 20

// reclaim sweeps every shard of a full table for ended state: s (locked by
// the caller) with its call's now, and each other shard that no one holds
// (TryLock: never waiting, so no lock order to keep). At most one runs at a
// time, and not again until fullSweepShare times its duration has passed:
// a call that finds one running or too recent is refused at once.
func (b *Backend) reclaim(s *shard, ms int64) {
	start := b.mono()
	if start.Nanoseconds() < b.nextFull.Load() || !b.fullSweep.CompareAndSwap(false, true) {
		return
	}
	defer b.fullSweep.Store(false)
	b.fullSweeps.Add(1)
	b.sweep(s, ms, true)
	for i := range b.shards {
		o := &b.shards[i]
		if o != s && o.mu.TryLock() {
			b.sweep(o, 0, false)
			o.mu.Unlock()
		}
	}
	end := b.mono()
	b.nextFull.Store(end.Nanoseconds() + (fullSweepShare-1)*(end-start).Nanoseconds())
}

// clockGuard is the callers' clock as cleanup trusts it. Each sweep made
// by a call records the call's offset, now − monotonic time; the trusted
// clock is the monotonic time plus the lowest offset recorded in the last
// hold to 2·hold of monotonic time. It is never ahead of the sweeping
// call's now. A clock that steps forward raises the offsets it shows, but
// the lower ones from before the step keep the trusted clock moving at real
// time's pace until they age out; a clock that steps back lowers it at
// once; a lagging call lowers it for a while.
type clockGuard struct {
	mu        sync.Mutex
	hold      int64 // Options.ClockHold in ms
	started   bool
	start     int64 // monotonic ms when the current epoch began
	cur, prev int64 // the lowest offsets of the current epoch and the one before; math.MaxInt64 for none
}

// bound returns the trusted clock (Unix ms) at monotonic time mono, first
// recording the sweeping call's now if sample is set; math.MaxInt64 when
// nothing is recorded. With nothing recorded before (a new backend, or one
// idle for 2·hold), a single call's now is not trusted alone: it records
// vouched instead, the lowest of it and the shard's recent calls' nows.
func (g *clockGuard) bound(mono, now, vouched int64, sample bool) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch d := mono - g.start; {
	case !g.started || d >= 2*g.hold:
		g.started, g.start, g.cur, g.prev = true, mono, math.MaxInt64, math.MaxInt64
	case d >= g.hold:
		g.start, g.cur, g.prev = mono, math.MaxInt64, g.cur
	}
	if sample {
		if g.cur == math.MaxInt64 && g.prev == math.MaxInt64 {
			now = vouched
		}
		g.cur = min(g.cur, satSub(now, mono))
	}
	if lo := min(g.cur, g.prev); lo != math.MaxInt64 {
		return satAdd(mono, lo)
	}
	return math.MaxInt64
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

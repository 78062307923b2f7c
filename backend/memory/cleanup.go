package memory

import (
	"math"
	"math/bits"
	"sync"
	"time"
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
	// high is the highest now of the shard's calls since its last flush
	// that the pace is shown, math.MinInt64 for none, and highMono the
	// monotonic ms when a call brought it: a call moves it only by the
	// pace's step or more, so under a clock that moves on the monotonic
	// clock is read about once per step of it, not per call.
	high      int64
	sinceScan int // calls since the last sweep
	table     table
	highMono  int64
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
	_               [56]byte   // 384 bytes: shards side by side share no cache line
}

func (s *shard) reset() {
	s.low, s.high, s.ref = math.MaxInt64, math.MinInt64, math.MinInt64
}

// observe records a call at ms in the locked shard s and reports whether
// enough calls have passed to pay for a sweep: at least as many as the
// shard holds, so a sweep costs O(1) per call amortised.
func (b *Backend) observe(s *shard, ms int64) bool {
	if ms < s.low {
		s.low, s.lowMono = ms, b.mono().Milliseconds()
		b.called.Store(true)
		if ms > s.high {
			s.high, s.highMono = ms, s.lowMono
		}
	} else if ms > s.high && satSub(ms, s.high) >= b.guard.pace.step {
		s.high, s.highMono = ms, b.mono().Milliseconds()
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
// that a call trailing by less than Lag still needs; and it moves the
// callers' clock on past the latest call it heard of only at the pace the
// calls showed (see pace). With no clock known the reference stays where
// it was.
func (b *Backend) reference(s *shard, now int64, called bool) int64 {
	mono := b.mono().Milliseconds()
	off := int64(math.MaxInt64)
	var seen [3]sample // the calls' nows, each with the monotonic ms it was seen at
	n := 0
	if s.high != math.MinInt64 {
		seen[n], n = sample{s.high, s.highMono}, n+1
		s.high = math.MinInt64
	}
	if s.low != math.MaxInt64 {
		seen[n], n = sample{s.low, s.lowMono}, n+1
		low := satSub(s.low, s.lowMono)
		if called {
			low = satAdd(low, b.lag)
		}
		off = low
		s.low = math.MaxInt64
	}
	if called {
		seen[n], n = sample{now, mono}, n+1
		off = min(off, satSub(now, mono))
	}
	bound := b.guard.bound(mono, off, !called, seen[:n])
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
	pace    pace
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
// recording the offset off (math.MaxInt64: none) and the calls seen;
// math.MaxInt64 when nothing was ever recorded. Paced (a sweep without a
// call), the clock moves on past the latest call seen only at the pace
// the calls showed: not at all for a clock that stands still, no faster
// than it ran for one that runs slow.
func (g *clockGuard) bound(mono, off int64, paced bool, seen []sample) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, x := range seen {
		g.pace.record(x)
	}
	t := g.trusted(mono, off)
	if paced && t != math.MaxInt64 {
		t = satSub(t, g.pace.behind(mono))
	}
	return t
}

// trusted is bound without the pace, g locked.
func (g *clockGuard) trusted(mono, off int64) int64 {
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

// sample is a call's now (Unix ms) and the monotonic ms it was seen at.
type sample struct{ now, mono int64 }

// pace tells whether the callers' clock keeps pace with real time, from the
// calls it is shown: the latest (by monotonic time) and two earlier ones at
// least window apart, so that it judges by the last one to two windows of
// real time with calls. A sweep without a call may move the callers' clock
// on past the latest call by the real time since, at the pace the clock
// advanced from the oldest of the three to the latest (at most real
// time's), and only if, from each of the two earlier ones, it advanced at
// least the real time it took less lag (a call may trail the clock by up
// to Lag) over at least a window in all: so a clock that stands still, or
// has stood still for more than Lag, or runs slower than real time by more
// than Lag over a window, is not moved on at all, and one that runs slow by
// less is moved on no faster than it ran. A real clock is moved on at real
// time's pace, so state that ended is reclaimed without calls, once calls
// spanning a window have shown that.
type pace struct {
	window, lag int64 // ms
	// step is how far (ms) a call's now must pass its shard's high to be
	// shown: a tenth of the window, 1 to 100 ms, so that a sample lags the
	// latest call by a small part of the span it is judged over.
	step               int64
	anchor, next, last sample
	started            bool
}

// newPace is the pace of a Backend of Options lag and sweepEvery: judged
// over a window of the longer of the two.
func newPace(lag, sweepEvery time.Duration) pace {
	w := max(lag.Milliseconds(), sweepEvery.Milliseconds(), 1)
	return pace{window: w, lag: lag.Milliseconds(), step: min(max(w/10, 1), 100)}
}

// record takes in a call seen at x. A call seen before the latest (a
// shard's sample flushed late) adds nothing.
func (p *pace) record(x sample) {
	switch {
	case !p.started:
		p.anchor, p.next, p.last, p.started = x, x, x, true
		return
	case x.mono < p.last.mono:
		return
	case x.mono == p.last.mono:
		p.last.now = min(p.last.now, x.now)
	default:
		p.last = x
	}
	if p.last.mono-p.next.mono >= p.window {
		p.anchor, p.next = p.next, p.last
	}
}

// behind is how far the callers' clock at monotonic time mono, as a sweep
// without a call may take it, is behind the latest call's now moved on by
// all the real time since: all of that time for a clock not shown to keep
// pace, none for one shown to keep it exactly.
func (p *pace) behind(mono int64) int64 {
	elapsed := mono - p.last.mono
	if !p.started || elapsed <= 0 {
		return 0
	}
	span, advance := p.last.mono-p.anchor.mono, satSub(p.last.now, p.anchor.now)
	if span < p.window || advance < span-p.lag || satSub(p.last.now, p.next.now) < p.last.mono-p.next.mono-p.lag {
		return elapsed
	}
	// elapsed·min(advance, span)/span, 128 bits wide: at most elapsed
	// (advance >= span−lag >= 0, as span >= window >= lag).
	hi, lo := bits.Mul64(uint64(elapsed), uint64(min(advance, span)))
	moved, _ := bits.Div64(hi, lo, uint64(span))
	return elapsed - int64(moved)
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

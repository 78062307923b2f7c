package memory

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// sweeper sweeps every shard for ended state each SweepEvery while the
// backend holds any, so that memory returns without calls to drive it. It
// is a timer, not a goroutine: between sweeps nothing runs, and a backend
// that holds nothing has no timer armed. The sweeps trust the callers'
// clock as sweeps made by calls do (see Cleanup), moved on past the latest
// call only at the pace the calls showed: no call's now is in them, only
// the clock guard's record and the monotonic clock.
type sweeper struct {
	every time.Duration
	armed atomic.Bool
	// sweep sweeps every shard and reports whether anything is held;
	// holding reports it without a sweep. Set by New.
	sweep   func() bool
	holding func() bool

	sweeping sync.Mutex // held by a sweep in progress, so that stop waits for it
	mu       sync.Mutex // guards timer and closed; never held while a shard is locked by run
	timer    *time.Timer
	closed   bool // stopped for good (Close)
}

// arm starts the timer if it is not running. Calls that store state call
// it (with their shard locked), so it costs one atomic load when the timer
// runs.
func (w *sweeper) arm() {
	if w.armed.Load() || !w.armed.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(w.every, w.run)
	} else {
		w.timer.Reset(w.every)
	}
}

// run sweeps, then re-arms the timer while anything is held. A store that
// raced with the decision to stop is seen by the check after armed is
// cleared, or arms the timer itself.
func (w *sweeper) run() {
	w.sweeping.Lock()
	defer w.sweeping.Unlock()
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return
	}
	held := w.sweep()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if !held {
		w.armed.Store(false)
		if !w.holding() || !w.armed.CompareAndSwap(false, true) {
			return
		}
	}
	w.timer.Reset(w.every)
}

// stop stops the timer for good and waits for a sweep in progress.
func (w *sweeper) stop() {
	w.mu.Lock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.sweeping.Lock()
	defer w.sweeping.Unlock()
}

// idleSweep is what the sweeper's last sweep went by, so that a sweep with
// nothing new to go by touches no shard.
type idleSweep struct {
	mu    sync.Mutex // serialises sweepAll
	ref   int64      // the trusted clock, as a sweep without a call takes it
	quiet bool       // the last sweep dropped nothing
}

// sweepAll is the sweeper's sweep: every shard that holds anything (a
// state, a second tier, or an emptied table's arrays), each with the clock
// the guard trusts. It reports whether the backend still holds anything.
// When no call came since its last sweep, which dropped nothing, and the
// trusted clock has not moved (a clock that stands still), a sweep would
// drop nothing either: it touches no shard, so that a backend whose clock
// stands still costs its timer almost nothing.
func (b *Backend) sweepAll() bool {
	b.idle.mu.Lock()
	defer b.idle.mu.Unlock()
	fresh := b.called.Swap(false)
	ref := b.guard.bound(b.mono().Milliseconds(), math.MaxInt64, true, nil)
	if !fresh && b.idle.quiet && ref == b.idle.ref {
		return true
	}
	before := b.keys.Load()
	defer func() { b.idle.ref, b.idle.quiet = ref, b.keys.Load() == before }()
	holding := false
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		if s.holds() {
			b.sweep(s, 0, false)
			holding = holding || s.holds()
		}
		s.mu.Unlock()
	}
	return holding
}

// holds reports whether the locked shard holds any memory a sweep may give
// back.
func (s *shard) holds() bool {
	return s.table.live > 0 || s.tier.cells != nil || s.table.slots != nil
}

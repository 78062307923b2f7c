package migration

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// Late calls ("Late calls" in docs/migration.md).
//
// A call that one store serves alone is routed when it starts. If a change
// of percentage moves its key while the call is in flight (a slow round
// trip, a process starved of CPU or stopped), the call reaches its store
// after the process has seen the change: the store the key moves to never
// counts it, except through the mirror. The moving keys cover that for as
// long as Settle allows (see Options.LateAfter); beyond it the call can let
// the store the key moves to admit what the call was not counted for. The
// Migration cannot make such a call exact, but it reports it: watched wraps
// each shadow the router sends single-store calls to, and a call during
// which this process saw a change that moved its key, answered more than
// LateAfter after the process saw it, is late.

// watched is a shadow as the router calls it for the keys one store serves
// alone: the calls pass through unchanged, and each is checked against the
// changes of percentage this process saw during it.
type watched struct {
	b     *shadow.Backend
	mv    *mover
	m     *Migration
	isNew bool // b serves from the new store
}

var _ throttler.LeaseBackend = (*watched)(nil)

func (w *watched) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	h := w.mv.hist.Load()
	d, err := w.b.Take(ctx, key, p, cost, now)
	w.check(h, key, p)
	return d, err
}

func (w *watched) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return w.b.Peek(ctx, key, p, now) // stores nothing: never late
}

func (w *watched) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	h := w.mv.hist.Load()
	d, err := w.b.Refund(ctx, key, p, cost, receipt, now)
	w.check(h, key, p)
	return d, err
}

func (w *watched) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	return w.b.Acquire(ctx, key, p, id, now)
}

func (w *watched) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	return w.b.Release(ctx, key, p, id, now)
}

// Traits are the shadow's.
func (w *watched) Traits() throttler.Traits { return throttler.TraitsOf(w.b) }

// check counts the call as late if, since it loaded h, this process saw a
// change that moved key away from the store that served the call, more than
// LateAfter before now. Calls during which nothing changed (nearly all)
// cost one atomic load.
func (w *watched) check(h *history, key string, p throttler.Policy) {
	now := w.mv.hist.Load()
	if now == h {
		return
	}
	if late, ok := w.mv.lateness(h, now, key, w.isNew); ok && late > w.m.lateAfter {
		w.m.moving.late.Add(1)
		if w.m.onLate != nil {
			w.m.onLate(key, p, late)
		}
	}
}

// lateness returns how long ago (now, on the monotonic clock) this process
// first saw a change after h, in h2, that routes key away from the store
// the call went to (isNew: the new one); false if none does.
func (mv *mover) lateness(h, h2 *history, key string, isNew bool) (time.Duration, bool) {
	b := mv.bucket.Bucket(key)
	routesNew := func(pct int) bool { return pct == 100 || pct > 0 && b <= pct }
	var last time.Duration // the latest change h knew of
	if n := len(h.marks); n > 0 {
		last = h.marks[n-1].until
	}
	// h2's marks after last are the percentages routed by between the
	// changes; the change at a mark's until ends its percentage. A key moved
	// by merged marks is treated as moved at the earliest: later, never
	// sooner, is what a lateness must not be.
	for i, mk := range h2.marks {
		if mk.until <= last {
			continue
		}
		next := h2.cur
		if i+1 < len(h2.marks) {
			next = h2.marks[i+1].lo
		}
		if routesNew(next) != isNew || routesNew(mk.lo) != routesNew(mk.hi) {
			return mv.mono() - mk.until, true
		}
	}
	return 0, false
}

// Package model holds the reference models every backend is checked
// against: Model, of the four rate algorithms, and LeaseModel, of the lease
// contract. Each is a backend written for clarity, not speed, and
// independently of the arithmetic the backends share (internal/algo,
// internal/leaseset): where the contract says "the least wait", a model
// searches millisecond by millisecond instead of using a formula. The
// conformance suites (backend/backendtest) compare every backend with
// them on random traces (RandomCall, Receipts), and backendtest's own tests
// compare the arithmetic with them.
package model

import (
	"context"
	"math/big"
	"sort"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// Model is the reference model of the four algorithms: a throttler.Backend
// written for clarity, not speed, independently of the arithmetic in
// internal/algo. Where the contract says "the least wait", it searches
// millisecond by millisecond instead of using a formula; a token bucket's
// products are big integers. Every backend is checked against it.
//
// It keeps every state it writes (it never reclaims), which is what a
// backend answers too unless it dropped state that had ended by the latest
// now it was given; the differential traces allow for exactly that. It is
// safe for concurrent use.
type Model struct {
	mu     sync.Mutex
	states map[modelKey]*modelState
}

type modelKey struct{ identity, key string }

type modelState struct {
	// fixed window
	used, resetAt int64
	// token bucket: scaled tokens and the ms of the last refill
	tokens, at int64
	// sliding log: one entry per admitted Take, never merged
	log []logItem
	// sliding window counter
	k, curr, prev int64
	// the window (ms) a bucket or counter was written under
	window int64
}

// logItem is one admitted Take in the model's sliding log.
type logItem struct{ At, Units int64 }

// NewModel returns an empty model.
func NewModel() *Model { return &Model{states: map[modelKey]*modelState{}} }

var _ throttler.Backend = (*Model)(nil)

// Take implements throttler.Backend.
func (m *Model) Take(_ context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return m.do(throttler.OpTake, key, p, cost, 0, now)
}

// Peek implements throttler.Backend.
func (m *Model) Peek(_ context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return m.do(throttler.OpPeek, key, p, 1, 0, now)
}

// Refund implements throttler.Backend.
func (m *Model) Refund(_ context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt); err != nil {
		return throttler.Decision{}, err
	}
	return m.do(throttler.OpRefund, key, p, cost, receipt.UnixMilli(), now)
}

// do runs op at now; r is a Refund's receipt in Unix ms.
func (m *Model) do(op throttler.Op, key string, p throttler.Policy, cost, r int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(op, key, p, cost, time.UnixMilli(r)); err != nil {
		return throttler.Decision{}, err
	}
	try := m.Try
	if p.Composite() {
		try = m.TryComposite
	}
	d, commit := try(op, key, p, cost, r, now.UnixMilli(), false)
	commit()
	return d, nil
}

// Try computes a call's Decision without storing anything (from no state
// at all when dropped is set); commit stores what the call would, the drop
// included.
func (m *Model) Try(op throttler.Op, key string, p throttler.Policy, cost, r, t int64, dropped bool) (throttler.Decision, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, commit := m.tryLocked(op, key, p, cost, r, t, dropped)
	return d, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		commit()
	}
}

// tryLocked is Try with m.mu held, whose commit needs m.mu held too.
func (m *Model) tryLocked(op throttler.Op, key string, p throttler.Policy, cost, r, t int64, dropped bool) (throttler.Decision, func()) {
	k := modelKey{identity.Rate(p), key}
	var cp *modelState
	if st := m.states[k]; st != nil && !dropped {
		c := *st
		c.log = append([]logItem(nil), st.log...)
		cp = &c
	}
	w := p.Window.Milliseconds()
	if cp != nil && (p.Algorithm == throttler.TokenBucket || p.Algorithm == throttler.SlidingWindow) && cp.window != w {
		cp = nil // written under another Window: read as no state
	}
	d, next := apply(p, cp, op, cost, r, t)
	if next != nil {
		next.window = w
	}
	return d, func() {
		if dropped {
			delete(m.states, k)
		}
		if next != nil {
			m.states[k] = next
		}
	}
}

// Forget drops the state of (p, key), as a backend may once it has ended.
func (m *Model) Forget(key string, p throttler.Policy) {
	m.mu.Lock()
	delete(m.states, modelKey{identity.Rate(p), key})
	m.mu.Unlock()
}

// End returns when the state of (p, key) stops mattering, in Unix ms, and
// whether any is stored: a window's reset-at, a bucket's refill to full,
// a log's newest entry's end, a counter pair's (K+2)·w.
func (m *Model) End(key string, p throttler.Policy) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.states[modelKey{identity.Rate(p), key}]
	if st == nil {
		return 0, false
	}
	w := p.Window.Milliseconds()
	switch p.Algorithm {
	case throttler.TokenBucket:
		// Search: the first ms at which a Peek sees a full bucket.
		return firstMS(st.at, func(t int64) bool {
			s, _ := bucketRefill(p, st, t)
			return s == p.Capacity()*w
		}), true
	case throttler.SlidingLog:
		end := int64(0)
		for _, e := range st.log {
			end = max(end, e.At+w)
		}
		return end, true
	case throttler.SlidingWindow:
		return (st.k + 2) * w, true
	}
	return st.resetAt, true
}

// apply returns the decision and the state to store (nil: store nothing);
// r is a Refund's receipt, the ResetAt of its Take in Unix ms.
func apply(p throttler.Policy, st *modelState, op throttler.Op, cost, r, t int64) (throttler.Decision, *modelState) {
	switch p.Algorithm {
	case throttler.TokenBucket:
		return modelBucket(p, st, op, cost, r, t)
	case throttler.SlidingLog:
		return modelLog(p, st, op, cost, r, t)
	case throttler.SlidingWindow:
		return modelCounter(p, st, op, cost, r, t)
	}
	return modelFixed(p, st, op, cost, r, t)
}

func modelFixed(p throttler.Policy, st *modelState, op throttler.Op, cost, r, t int64) (throttler.Decision, *modelState) {
	w := p.Window.Milliseconds()
	open := st != nil && st.resetAt > t
	used, reset := int64(0), t+w
	if open {
		used, reset = st.used, st.resetAt
	}
	var next *modelState
	allowed := used+1 <= p.Limit
	switch op {
	case throttler.OpTake:
		allowed = used+cost <= p.Limit
		if allowed {
			used += cost
			next = &modelState{used: used, resetAt: reset}
		}
	case throttler.OpRefund:
		// Only the window the Take counted in: its reset-at is r.
		if open && st.resetAt == r {
			used = max(0, used-cost)
			next = &modelState{used: used, resetAt: reset}
		}
		allowed = used+1 <= p.Limit
	}
	d := throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(0, p.Limit-used), ResetAt: time.UnixMilli(reset)}
	if !allowed {
		d.RetryAfter = time.Duration(reset-t) * time.Millisecond
	}
	return d, next
}

// bucketRefill returns the scaled tokens and t0 after refilling st (nil: a
// full bucket) at t, with big integers so no product can overflow.
func bucketRefill(p throttler.Policy, st *modelState, t int64) (int64, int64) {
	full := p.Capacity() * p.Window.Milliseconds()
	if st == nil {
		return full, t
	}
	s, t0 := min(st.tokens, full), st.at
	if t > t0 {
		v := new(big.Int).Mul(big.NewInt(t-t0), big.NewInt(p.Limit))
		v.Add(v, big.NewInt(s))
		if v.Cmp(big.NewInt(full)) > 0 {
			v.SetInt64(full)
		}
		s, t0 = v.Int64(), t
	}
	return s, t0
}

func modelBucket(p throttler.Policy, st *modelState, op throttler.Op, cost, r, t int64) (throttler.Decision, *modelState) {
	w, capacity := p.Window.Milliseconds(), p.Capacity()
	full := capacity * w
	s, t0 := bucketRefill(p, st, t)
	var next *modelState
	want := int64(1)
	switch op {
	case throttler.OpTake:
		want = cost
		if s >= cost*w {
			s -= cost * w
			next = &modelState{tokens: s, at: t0}
		}
	case throttler.OpRefund:
		// A full bucket is no state; and once a clock that wrote or reads
		// the state has reached r, the bucket has been full since the
		// Take (later Takes only delay that): the units came back.
		if st != nil && s < full && max(t, st.at) < r {
			s = min(full, s+min(cost, capacity)*w)
			next = &modelState{tokens: s, at: t0}
		}
	}
	allowed := s >= want*w
	if op == throttler.OpTake {
		allowed = next != nil
	}
	d := throttler.Decision{Allowed: allowed, Limit: capacity, Remaining: s / w}
	d.Used = capacity - d.Remaining
	after := &modelState{tokens: s, at: t0}
	// ResetAt: the first ms from t0 on at which the bucket is full.
	d.ResetAt = time.UnixMilli(firstMS(t0, func(u int64) bool {
		r, _ := bucketRefill(p, after, u)
		return r == full
	}))
	if !allowed {
		// The least wait from t after which want tokens are there.
		d.RetryAfter = msSince(t, firstMS(t, func(u int64) bool {
			r, _ := bucketRefill(p, after, u)
			return r >= want*w
		}))
	}
	return d, next
}

func modelLog(p throttler.Policy, st *modelState, op throttler.Op, cost, r, t int64) (throttler.Decision, *modelState) {
	w := p.Window.Milliseconds()
	var log []logItem
	if st != nil {
		log = st.log
	}
	usedAt := func(log []logItem, u int64) int64 {
		n := int64(0)
		for _, e := range log {
			if u < e.At+w {
				n += e.Units
			}
		}
		return n
	}
	used := usedAt(log, t)
	var next *modelState
	want := int64(1)
	switch op {
	case throttler.OpTake:
		want = cost
		if used+cost <= p.Limit {
			var kept []logItem
			for _, e := range log {
				if t < e.At+w {
					kept = append(kept, e)
				}
			}
			log = append(kept, logItem{At: t, Units: cost})
			used += cost
			next = &modelState{log: log}
		}
	case throttler.OpRefund:
		// Newest entries first, of the live ones logged by the Take's
		// own: at or before r−w.
		sort.SliceStable(log, func(i, j int) bool { return log[i].At < log[j].At })
		mine := int64(0)
		for _, e := range log {
			if t < e.At+w && e.At <= r-w {
				mine += e.Units
			}
		}
		left := min(cost, mine)
		if left > 0 {
			for i := len(log) - 1; i >= 0 && left > 0; i-- {
				if t < log[i].At+w && log[i].At <= r-w {
					n := min(left, log[i].Units)
					log[i].Units -= n
					left -= n
				}
			}
			var kept []logItem
			for _, e := range log {
				if e.Units > 0 {
					kept = append(kept, e)
				}
			}
			log = kept
			used = usedAt(log, t)
			next = &modelState{log: log}
		}
	}
	allowed := used+1 <= p.Limit // one more unit, for Peek and Refund
	if op == throttler.OpTake {
		allowed = next != nil
	}
	d := throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(0, p.Limit-used), ResetAt: time.UnixMilli(t + w)}
	newest := int64(-1 << 62)
	for _, e := range log {
		if t < e.At+w {
			newest = max(newest, e.At)
		}
	}
	if newest > -1<<62 {
		d.ResetAt = time.UnixMilli(newest + w)
	}
	if !allowed {
		d.RetryAfter = msSince(t, firstMS(t, func(u int64) bool { return usedAt(log, u)+want <= p.Limit }))
	}
	return d, next
}

// counterView is what a sliding-window counter shows at t: the window
// index, the offset into it, the two counts, and how far the call was
// moved forward because the clock was behind the state.
func counterView(p throttler.Policy, st *modelState, t int64) (k, e, curr, prev, behind int64) {
	w := p.Window.Milliseconds()
	k = t / w
	if t%w != 0 && t < 0 {
		k--
	}
	e = t - k*w
	if st == nil {
		return k, e, 0, 0, 0
	}
	if k < st.k {
		behind, k, e = st.k*w-t, st.k, 0
	}
	switch k - st.k {
	case 0:
		curr, prev = min(st.curr, p.Limit), min(st.prev, p.Limit)
	case 1:
		prev = min(st.curr, p.Limit)
	}
	return k, e, curr, prev, behind
}

func counterUsedAt(p throttler.Policy, curr, prev, e int64) int64 {
	w := p.Window.Milliseconds()
	weighted := new(big.Int).Mul(big.NewInt(prev), big.NewInt(w-e))
	q, r := new(big.Int).QuoRem(weighted, big.NewInt(w), new(big.Int))
	n := q.Int64()
	if r.Sign() > 0 {
		n++
	}
	return curr + n
}

func modelCounter(p throttler.Policy, st *modelState, op throttler.Op, cost, r, t int64) (throttler.Decision, *modelState) {
	w := p.Window.Milliseconds()
	k, e, curr, prev, _ := counterView(p, st, t)
	var next *modelState
	want := int64(1)
	switch op {
	case throttler.OpTake:
		want = cost
		if curr+counterUsedAt(p, 0, prev, e)+cost <= p.Limit {
			curr += cost
			next = &modelState{k: k, curr: curr, prev: prev}
		}
	case throttler.OpRefund:
		// Only in the Take's window K, which ends at r: K == r/w − 1.
		if st != nil && k == st.k && r%w == 0 && k == r/w-1 {
			curr = max(0, curr-cost)
			next = &modelState{k: k, curr: curr, prev: prev}
		}
	}
	used := counterUsedAt(p, curr, prev, e)
	d := throttler.Decision{Limit: p.Limit, Used: used, Remaining: max(0, p.Limit-used), ResetAt: time.UnixMilli((k + 1) * w)}
	if op == throttler.OpTake {
		d.Allowed = next != nil
	} else {
		d.Allowed = d.Remaining >= 1
	}
	if !d.Allowed {
		// The least wait after which a Take of want fits, if nothing else
		// happens: search the instants from t on.
		after := st
		if next != nil {
			after = next
		}
		d.RetryAfter = msSince(t, firstMS(t, func(u int64) bool {
			_, eu, cu, pu, _ := counterView(p, after, u)
			return counterUsedAt(p, cu, pu, eu)+want <= p.Limit
		}))
	}
	return d, next
}

// firstMS returns the least u >= from for which ok(u) holds; ok must be
// monotone (false, then true for good) and true somewhere.
func firstMS(from int64, ok func(int64) bool) int64 {
	if ok(from) {
		return from
	}
	lo, step := from, int64(1) // ok(lo) is false
	for !ok(from + step) {
		lo, step = from+step, step*2
	}
	hi := from + step // ok(hi) is true
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func msSince(t, u int64) time.Duration { return time.Duration(u-t) * time.Millisecond }

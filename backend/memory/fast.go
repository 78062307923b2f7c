package memory

import "math/bits"

// The common Take of each algorithm, an admitted one on stored state,
// computed in place on a slot: the arithmetic of the general path
// (algo.WindowState, TokenBucket, Counter; a log's is LogBuffer.Take) for
// that case alone, so a hot key skips the general functions' other
// branches and the copies of their states and Decision. Each returns the
// Decision's Used and ResetAt (Unix ms), or reports false, changing
// nothing, for a call outside its case; the general path then answers it.
// fast_test.go holds them to the general functions at every boundary of
// their cases.

// takeFixed is the admitted Take of cost at t in the slot's open window.
func (w *slot) takeFixed(limit, cost, t int64) (used, resetAt int64, ok bool) {
	if w.resetAt <= t || w.used+cost > limit {
		return 0, 0, false
	}
	w.used += cost
	return w.used, w.resetAt, true
}

// takeBucket is the admitted Take of cost at t on the slot's bucket, stored
// under the policy's window wms (in ms) by a clock not ahead of t (t >= At).
// Its ResetAt, when the bucket is full again, is also the slot's end.
func (w *slot) takeBucket(limit, capacity, wms, cost, t int64) (used, resetAt int64, ok bool) {
	if w.prev != wms || t < w.resetAt { // prev: the bucket's window
		return 0, 0, false
	}
	full := capacity * wms
	s := min(max(w.used, 0), full)
	// Refill: (t−At)·Limit, 128 bits wide, against the deficit; t == At
	// refills nothing, as TokenBucket does.
	if hi, lo := bits.Mul64(uint64(t-w.resetAt), uint64(limit)); hi != 0 || lo >= uint64(full-s) {
		s = full
	} else {
		s += int64(lo)
	}
	need := cost * wms
	if s < need {
		return 0, 0, false
	}
	s -= need
	// ceil((full−s)/Limit), full−s >= need > 0.
	resetAt = t + (full-s+limit-1)/limit
	w.used, w.resetAt, w.end = s, t, resetAt
	return capacity - s/wms, resetAt, true
}

// takeCounter is the admitted Take of cost at t on the slot's counter pair,
// stored under the policy's window wms, within the window K the pair counts
// in (K·wms <= t < (K+1)·wms). Its ResetAt is (K+1)·wms; the pair's end,
// (K+2)·wms, does not move.
func (w *slot) takeCounter(limit, wms, cost, t int64) (used, resetAt int64, ok bool) {
	if w.end != wms { // end: the pair's window
		return 0, 0, false
	}
	start := w.resetAt * wms // the pair's K is in resetAt
	if t < start || t-start >= wms {
		return 0, 0, false
	}
	curr, prev := min(max(w.used, 0), limit), min(max(w.prev, 0), limit)
	weighted := int64(0) // ceil(prev·(wms−e)/wms), e = t−start
	if prev > 0 {
		weighted = (prev*(wms-(t-start)) + wms - 1) / wms
	}
	if cost > limit-curr-weighted {
		return 0, 0, false
	}
	curr += cost
	w.used, w.prev = curr, prev
	return curr + weighted, start + wms, true
}

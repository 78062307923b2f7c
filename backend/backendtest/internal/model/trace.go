package model

import (
	"math/rand/v2"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// Random traces: a conformance suite and the arithmetic's tests drive a
// backend and a Model with the same calls and compare the answers.

// RandomCall moves a trace's clock (mostly a little forward, sometimes
// back as a caller whose clock is behind, sometimes far ahead) and picks an
// operation, Takes three times in five, and a cost up to p's capacity.
func RandomCall(rng *rand.Rand, now int64, p throttler.Policy) (int64, throttler.Op, int64) {
	switch r := rng.IntN(20); {
	case r < 12:
		now += int64(rng.IntN(12))
	case r < 16:
		now -= int64(rng.IntN(40))
	default:
		now += int64(rng.IntN(250))
	}
	op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(5)]
	return now, op, 1 + int64(rng.IntN(int(p.Capacity())))
}

// Receipts keeps the receipts (ResetAt, Unix ms) of the latest admitted
// Takes of each (key, policy) of a trace, for its Refunds to name.
type Receipts map[modelKey][]int64

// Add keeps r, the receipt of an admitted Take of key under p, forgetting
// the oldest beyond the latest four.
func (rs Receipts) Add(key string, p throttler.Policy, r int64) {
	k := modelKey{identity.Rate(p), key}
	l := append(rs[k], r)
	if len(l) > 4 {
		l = l[1:]
	}
	rs[k] = l
}

// Pick returns the receipt of one of the latest admitted Takes, the latest
// most often, or of a Take the store never saw when there was none.
func (rs Receipts) Pick(rng *rand.Rand, key string, p throttler.Policy, now int64) int64 {
	l := rs[modelKey{identity.Rate(p), key}]
	if len(l) == 0 || rng.IntN(8) == 0 {
		return now + 1 + rng.Int64N(p.Window.Milliseconds())
	}
	if rng.IntN(2) == 0 {
		return l[len(l)-1]
	}
	return l[rng.IntN(len(l))]
}

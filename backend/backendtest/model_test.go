package backendtest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// kitState runs the arithmetic of package backend on one key's state.
type kitState struct {
	bucket  backend.TokenBucketState
	counter backend.CounterState
	log     []backend.LogEntry
	stored  bool
}

func (k *kitState) do(p throttler.Policy, op throttler.Op, cost, r, t int64) throttler.Decision {
	var d throttler.Decision
	var write bool
	switch p.Algorithm {
	case throttler.TokenBucket:
		var next backend.TokenBucketState
		d, next, write = backend.TokenBucket(p, k.bucket, k.stored, op, cost, r, t)
		if write {
			k.bucket = next
		}
	case throttler.SlidingWindow:
		var next backend.CounterState
		d, next, write = backend.Counter(p, k.counter, k.stored, op, cost, r, t)
		if write {
			k.counter = next
		}
	case throttler.SlidingLog:
		var next []backend.LogEntry
		d, next, write = backend.Log(p, k.log, op, cost, r, t)
		if write {
			k.log = next
		}
	}
	k.stored = k.stored || write
	return d
}

// The kit's formulas agree with the model's searches on random traces of
// one key, with the clock jumping both ways and refunds naming earlier
// Takes.
func TestKitMatchesModel(t *testing.T) {
	ctx := context.Background()
	policies := []throttler.Policy{
		{Limit: 5, Window: 100 * time.Millisecond, Algorithm: throttler.TokenBucket},
		{Limit: 3, Window: 70 * time.Millisecond, Algorithm: throttler.TokenBucket, Burst: 7},
		{Limit: 7, Window: 13 * time.Millisecond, Algorithm: throttler.TokenBucket, Burst: 2},
		{Limit: 5, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 9, Window: 37 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 5, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingWindow},
		{Limit: 11, Window: 29 * time.Millisecond, Algorithm: throttler.SlidingWindow},
	}
	for seed := uint64(1); seed <= 40; seed++ {
		for _, p := range policies {
			rng := rand.New(rand.NewPCG(seed, 7))
			m := NewModel()
			var k kitState
			rs := receipts{}
			t0 := T0.UnixMilli()
			for i := 0; i < 400; i++ {
				var op throttler.Op
				var cost int64
				t0, op, cost = randomCall(rng, t0, p)
				r := rs.pick(rng, "k", p, t0)
				want, err := backend.Do(ctx, m, op, "k", p, cost, time.UnixMilli(r), time.UnixMilli(t0))
				require.NoError(t, err)
				got := k.do(p, op, cost, r, t0)
				require.Equal(t, want, got, "seed %d policy %v step %d: %v cost %d at %d (receipt %d)", seed, p, i, op, cost, t0, r)
				if op == throttler.OpTake && got.Allowed {
					rs.add("k", p, got.ResetAt.UnixMilli())
				}
			}
		}
	}
}

package algo_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/model"
	"github.com/throttlekit/throttlekit/throttler"
)

// state runs the arithmetic of this package on one key's state.
type state struct {
	bucket  algo.TokenBucketState
	counter algo.CounterState
	log     []algo.LogEntry
	stored  bool
}

func (k *state) do(p throttler.Policy, op throttler.Op, cost, r, t int64) throttler.Decision {
	var d throttler.Decision
	var write bool
	switch p.Algorithm {
	case throttler.TokenBucket:
		var next algo.TokenBucketState
		d, next, write = algo.TokenBucket(p, k.bucket, k.stored, op, cost, r, t)
		if write {
			k.bucket = next
		}
	case throttler.SlidingWindow:
		var next algo.CounterState
		d, next, write = algo.Counter(p, k.counter, k.stored, op, cost, r, t)
		if write {
			k.counter = next
		}
	case throttler.SlidingLog:
		var next []algo.LogEntry
		d, next, write = algo.Log(p, k.log, op, cost, r, t)
		if write {
			k.log = next
		}
	}
	k.stored = k.stored || write
	return d
}

// The formulas agree with the model's searches on random traces of
// one key, with the clock jumping both ways and refunds naming earlier
// Takes.
func TestAlgorithmsMatchModel(t *testing.T) {
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
			m := model.NewModel()
			var k state
			rs := model.Receipts{}
			t0 := backendtest.T0.UnixMilli()
			for i := 0; i < 400; i++ {
				var op throttler.Op
				var cost int64
				t0, op, cost = model.RandomCall(rng, t0, p)
				r := rs.Pick(rng, "k", p, t0)
				want, err := backend.Do(ctx, m, op, "k", p, cost, time.UnixMilli(r), time.UnixMilli(t0))
				require.NoError(t, err)
				got := k.do(p, op, cost, r, t0)
				require.Equal(t, want, got, "seed %d policy %v step %d: %v cost %d at %d (receipt %d)", seed, p, i, op, cost, t0, r)
				if op == throttler.OpTake && got.Allowed {
					rs.Add("k", p, got.ResetAt.UnixMilli())
				}
			}
		}
	}
}

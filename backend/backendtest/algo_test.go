package backendtest_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// The arithmetic the Go backends share (internal/algo) answers as the
// reference model. These tests live here because the model is internal to
// this package.

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

// A LogBuffer kept across calls answers as the reference model on long
// random traces: logs of hundreds of entries (so ended entries are dropped
// by index, the array is compacted and reused, and searches gallop), the
// clock stepping back (entries from the future) and jumping ahead, Peeks,
// Refunds and denied Takes. Log, which builds a buffer per call from a
// slice, answers the same.
func TestLogBufferMatchesModel(t *testing.T) {
	ctx := context.Background()
	for _, p := range []throttler.Policy{
		{Limit: 300, Window: 200 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 40, Window: 7 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 1, Window: time.Millisecond, Algorithm: throttler.SlidingLog},
	} {
		for seed := uint64(1); seed <= 6; seed++ {
			rng := rand.New(rand.NewPCG(seed, 11))
			m := model.NewModel()
			var buf algo.LogBuffer
			var log []algo.LogEntry
			now := backendtest.T0.UnixMilli()
			var receipts []int64 // of the latest admitted Takes
			for i := 0; i < 4000; i++ {
				switch r := rng.IntN(100); {
				case r < 80:
					now += int64(rng.IntN(3))
				case r < 92:
					now -= int64(rng.IntN(30))
				default:
					now += int64(rng.IntN(400))
				}
				op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(6)]
				cost := 1 + rng.Int64N(min(p.Limit, 5))
				if rng.IntN(50) == 0 {
					cost = 1 + rng.Int64N(p.Limit) // a big one, often denied
				}
				// A Refund names one of the latest Takes, or one never made.
				r := now + 1 + rng.Int64N(p.Window.Milliseconds())
				if n := len(receipts); n > 0 && rng.IntN(8) != 0 {
					r = receipts[max(0, n-1-rng.IntN(4))]
				}
				msg := []any{"policy %v seed %d step %d: %v %d at %d, receipt %d", p, seed, i, op, cost, now, r}
				want, err := backend.Do(ctx, m, op, "k", p, cost, time.UnixMilli(r), time.UnixMilli(now))
				require.NoError(t, err)
				got, _ := buf.Apply(p, op, cost, r, now)
				if op == throttler.OpTake && got.Allowed {
					receipts = append(receipts, got.ResetAt.UnixMilli())
				}
				got.ResetAt = time.UnixMilli(got.ResetAt.UnixMilli())
				want.ResetAt = time.UnixMilli(want.ResetAt.UnixMilli())
				require.Equal(t, want, got, msg...)
				d, next, write := algo.Log(p, slices.Clone(log), op, cost, r, now)
				d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli())
				require.Equal(t, want, d, msg...)
				if write {
					log = next
				}
				if end, ok := m.End("k", p); ok && buf.Len() > 0 {
					require.Equal(t, end, buf.End(p), msg...)
				}
			}
		}
	}
}

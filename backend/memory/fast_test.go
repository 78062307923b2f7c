package memory

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// Each fast path takes exactly the calls its comment names, and for those
// computes what the general path computes: the Decision (Used, ResetAt;
// the rest follows from them), the state written and the slot's end.

func TestTakeFixedBoundaries(t *testing.T) {
	p := throttler.Policy{Limit: 5, Window: time.Second}
	for _, tc := range []struct {
		name          string
		used, resetAt int64
		cost, at      int64
		ok            bool
	}{
		{"open, room", 2, 1000, 3, 999, true},
		{"last ms of the window", 0, 1000, 1, 999, true},
		{"ended at this ms", 0, 1000, 1, 1000, false},
		{"fills it exactly", 4, 1000, 1, 500, true},
		{"one unit over", 5, 1000, 1, 500, false},
	} {
		w := slot{used: tc.used, resetAt: tc.resetAt, end: tc.resetAt}
		before := w
		used, resetAt, ok := w.takeFixed(p.Limit, tc.cost, tc.at)
		require.Equal(t, tc.ok, ok, tc.name)
		if !ok {
			assert.Equal(t, before, w, "%s: nothing changed", tc.name)
			continue
		}
		want := algo.WindowState(p, tc.used+tc.cost, time.UnixMilli(tc.resetAt), time.UnixMilli(tc.at), true)
		assert.Equal(t, want.Used, used, tc.name)
		assert.Equal(t, want.ResetAt.UnixMilli(), resetAt, tc.name)
		assert.Equal(t, tc.used+tc.cost, w.used, tc.name)
	}
}

func TestTakeBucketBoundaries(t *testing.T) {
	// 2 tokens per second into 4: a token is 1000 scaled units, 2 refill
	// per ms, so a token takes 500 ms.
	p := throttler.Policy{Limit: 2, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 4}
	const full = 4000
	for _, tc := range []struct {
		name            string
		tokens, at, wnd int64
		cost, t         int64
		ok              bool
	}{
		{"full, same ms", full, 100, 1000, 1, 100, true},
		{"same ms: nothing refills", 1000, 100, 1000, 1, 100, true},
		{"same ms, one unit short", 999, 100, 1000, 1, 100, false},
		{"clock behind the state", full, 100, 1000, 1, 99, false},
		{"another window: the general path", full, 100, 999, 1, 200, false},
		{"refill reaches the deficit exactly", 2000, 100, 1000, 1, 100 + 1000, true},
		{"refill one ms short of full", 2000, 100, 1000, 1, 100 + 999, true},
		{"refill makes exactly the cost", 0, 100, 1000, 2, 100 + 1000, true},
		{"refill one scaled unit short of the cost", 1, 100, 1000, 2, 100 + 999, false},
		{"a huge gap: the product needs 128 bits", 0, -1 << 62, 1000, 4, 1 << 62, true},
		{"negative tokens read as 0", -5, 100, 1000, 1, 600, true},
		{"tokens above full read as full", full + 9, 100, 1000, 4, 100, true},
	} {
		w := slot{meta: kindBucket << 5, used: tc.tokens, resetAt: tc.at, prev: tc.wnd, end: 7}
		before := w
		used, resetAt, ok := w.takeBucket(p.Limit, p.Capacity(), p.Window.Milliseconds(), tc.cost, tc.t)
		require.Equal(t, tc.ok, ok, tc.name)
		if !ok {
			assert.Equal(t, before, w, "%s: nothing changed", tc.name)
			continue
		}
		st := algo.TokenBucketState{Tokens: tc.tokens, At: tc.at, Window: tc.wnd}
		d, next, write := algo.TokenBucket(p, st, true, throttler.OpTake, tc.cost, 0, tc.t)
		require.True(t, write && d.Allowed, tc.name)
		assert.Equal(t, d.Used, used, tc.name)
		assert.Equal(t, d.ResetAt.UnixMilli(), resetAt, tc.name)
		assert.Equal(t, next, algo.TokenBucketState{Tokens: w.used, At: w.resetAt, Window: w.window()}, tc.name)
		assert.Equal(t, algo.TokenBucketEnd(p, next), w.end, tc.name)
	}
}

func TestTakeCounterBoundaries(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.SlidingWindow}
	for _, tc := range []struct {
		name               string
		k, curr, prev, wnd int64
		cost, t            int64
		ok                 bool
	}{
		{"first ms of window K", 5, 2, 4, 1000, 1, 5000, true},
		{"last ms of window K", 5, 2, 4, 1000, 1, 5999, true},
		{"the next window: the general path", 5, 2, 4, 1000, 1, 6000, false},
		{"the window before (a clock behind)", 5, 2, 4, 1000, 1, 4999, false},
		{"another window size", 5, 2, 4, 999, 1, 5000, false},
		{"no previous count", 5, 2, 0, 1000, 8, 5000, true},
		{"fits exactly: 2 + ceil(4·0.75) + 5", 5, 2, 4, 1000, 5, 5250, true},
		{"one unit over", 5, 2, 4, 1000, 6, 5250, false},
		{"counts above Limit read as Limit", 5, 0, 99, 1000, 1, 5999, true},
		{"negative counts read as 0", 5, -3, -3, 1000, 10, 5500, true},
		{"before 1970", -3, 1, 1, 1000, 1, -2500, true},
	} {
		w := slot{meta: kindCounter << 5, resetAt: tc.k, used: tc.curr, prev: tc.prev, end: tc.wnd}
		before := w
		used, resetAt, ok := w.takeCounter(p.Limit, p.Window.Milliseconds(), tc.cost, tc.t)
		require.Equal(t, tc.ok, ok, tc.name)
		if !ok {
			assert.Equal(t, before, w, "%s: nothing changed", tc.name)
			continue
		}
		st := algo.CounterState{K: tc.k, Curr: tc.curr, Prev: tc.prev, Window: tc.wnd}
		d, next, write := algo.Counter(p, st, true, throttler.OpTake, tc.cost, 0, tc.t)
		require.True(t, write && d.Allowed, tc.name)
		assert.Equal(t, d.Used, used, tc.name)
		assert.Equal(t, d.ResetAt.UnixMilli(), resetAt, tc.name)
		assert.Equal(t, next, algo.CounterState{K: w.resetAt, Curr: w.used, Prev: w.prev, Window: w.window()}, tc.name)
		assert.Equal(t, algo.CounterEnd(p, next), w.ends(), tc.name)
	}
}

// Random states around the fast paths' edges: whenever the general path
// admits a Take of stored state that the fast path's case covers, the fast
// path takes it and agrees; otherwise it changes nothing.
func TestFastPathsAgreeWithTheGeneralPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	near := func(x int64) int64 { return x + rng.Int64N(7) - 3 }
	for i := 0; i < 20000; i++ {
		limit := 1 + rng.Int64N(20)
		wnd := 1 + rng.Int64N(50)
		cost := 1 + rng.Int64N(limit)
		t0 := rng.Int64N(2000) - 1000

		pb := throttler.Policy{Limit: limit, Window: time.Duration(wnd) * time.Millisecond, Algorithm: throttler.TokenBucket, Burst: rng.Int64N(25)}
		full := pb.Capacity() * wnd
		bs := algo.TokenBucketState{Tokens: near(rng.Int64N(full + 1)), At: t0, Window: []int64{wnd, wnd, wnd + 1}[rng.IntN(3)]}
		if cost <= pb.Capacity() {
			at := near(t0 + rng.Int64N(3*wnd))
			w := slot{meta: kindBucket << 5, used: bs.Tokens, resetAt: bs.At, prev: bs.Window}
			before := w
			used, resetAt, ok := w.takeBucket(limit, pb.Capacity(), wnd, cost, at)
			d, next, write := algo.TokenBucket(pb, bs, true, throttler.OpTake, cost, 0, at)
			if covered := bs.Window == wnd && at >= bs.At; covered && write {
				require.True(t, ok, "bucket %v %+v take %d at %d", pb, bs, cost, at)
				require.Equal(t, d.Used, used)
				require.Equal(t, d.ResetAt.UnixMilli(), resetAt)
				require.Equal(t, next, algo.TokenBucketState{Tokens: w.used, At: w.resetAt, Window: w.window()})
				require.Equal(t, algo.TokenBucketEnd(pb, next), w.end)
			} else {
				require.False(t, ok, "bucket %v %+v take %d at %d", pb, bs, cost, at)
				require.Equal(t, before, w)
			}
		}

		pc := throttler.Policy{Limit: limit, Window: time.Duration(wnd) * time.Millisecond, Algorithm: throttler.SlidingWindow}
		k := t0 / wnd
		cs := algo.CounterState{K: k, Curr: near(rng.Int64N(limit + 1)), Prev: near(rng.Int64N(limit + 1)), Window: []int64{wnd, wnd, wnd + 1}[rng.IntN(3)]}
		at := near(k*wnd + rng.Int64N(wnd+2))
		w := slot{meta: kindCounter << 5, resetAt: cs.K, used: cs.Curr, prev: cs.Prev, end: cs.Window}
		before := w
		used, resetAt, ok := w.takeCounter(limit, wnd, cost, at)
		d, next, write := algo.Counter(pc, cs, true, throttler.OpTake, cost, 0, at)
		if covered := cs.Window == wnd && at >= k*wnd && at < (k+1)*wnd; covered && write {
			require.True(t, ok, "counter %v %+v take %d at %d", pc, cs, cost, at)
			require.Equal(t, d.Used, used)
			require.Equal(t, d.ResetAt.UnixMilli(), resetAt)
			require.Equal(t, next, algo.CounterState{K: w.resetAt, Curr: w.used, Prev: w.prev, Window: w.window()})
			require.Equal(t, algo.CounterEnd(pc, next), w.ends())
		} else {
			require.False(t, ok, "counter %v %+v take %d at %d", pc, cs, cost, at)
			require.Equal(t, before, w)
		}
	}
}

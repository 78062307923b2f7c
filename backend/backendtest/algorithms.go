package backendtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// row is one call at T0+at and the whole Decision it must return.
type row struct {
	op        throttler.Op
	at        time.Duration
	cost      int64
	allowed   bool
	used      int64
	remaining int64
	resetAt   time.Duration // offset from T0
	retry     time.Duration
	why       string
}

const ms = time.Millisecond

func runRows(t *testing.T, b throttler.Backend, key string, p throttler.Policy, rows []row) {
	t.Helper()
	for i, r := range rows {
		now := T0.Add(r.at)
		d, err := backend.Do(context.Background(), b, r.op, key, p, r.cost, now)
		msg := fmt.Sprintf("row %d: %v %d at +%v (%s)", i, r.op, r.cost, r.at, r.why)
		require.NoError(t, err, msg)
		want := throttler.Decision{Allowed: r.allowed, Limit: p.Capacity(), Used: r.used, Remaining: r.remaining,
			ResetAt: time.UnixMilli(T0.Add(r.resetAt).UnixMilli()), RetryAfter: r.retry}
		d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli()) // compare instants, not locations
		require.Equal(t, want, d, msg)
	}
}

// testTokenBucket: 2 tokens per second into a bucket of 4; one token is
// 1000 scaled units and 2 refill per ms, so a token takes 500 ms.
func testTokenBucket(t *testing.T, b throttler.Backend, key func(string) string) {
	p := throttler.Policy{Name: "tb", Limit: 2, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 4}
	const take, peek, refund = throttler.OpTake, throttler.OpPeek, throttler.OpRefund
	runRows(t, b, key("k"), p, []row{
		{take, 0, 3, true, 3, 1, 1500 * ms, 0, "a new key is a full bucket"},
		{take, 0, 2, false, 3, 1, 1500 * ms, 500 * ms, "one token short: 500 ms to refill it"},
		{peek, 250 * ms, 1, true, 3, 1, 1500 * ms, 0, "half a token refilled, not stored"},
		{take, 500 * ms, 2, true, 4, 0, 2500 * ms, 0, "refilled to 2 tokens, both taken"},
		{take, 400 * ms, 1, false, 4, 0, 2500 * ms, 600 * ms, "a clock 100 ms behind refills nothing and waits from t0"},
		{refund, 400 * ms, 1, true, 3, 1, 2000 * ms, 0, "a refund from behind adds a token, t0 stays"},
		{peek, 10 * time.Second, 1, true, 0, 4, 10 * time.Second, 0, "long after: full, reset is now"},
		{refund, 10 * time.Second, 1, true, 0, 4, 10 * time.Second, 0, "a refund to a full bucket stores nothing"},
		{take, 9900 * ms, 1, true, 1, 3, 10400 * ms, 0, "so a clock behind it refills from its own t, as with no state"},
	})
	runRows(t, b, key("fresh"), p, []row{
		{refund, 0, 2, true, 0, 4, 0, 0, "a refund to a key with no state stores nothing"},
		{take, ms, 4, true, 4, 0, 2001 * ms, 0, "so the whole burst is there"},
	})
}

// testSlidingLog: at most 3 in any second.
func testSlidingLog(t *testing.T, b throttler.Backend, key func(string) string) {
	p := throttler.Policy{Name: "sl", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog}
	const take, peek, refund = throttler.OpTake, throttler.OpPeek, throttler.OpRefund
	runRows(t, b, key("k"), p, []row{
		{take, 0, 2, true, 2, 1, 1000 * ms, 0, "logged at 0"},
		{take, 300 * ms, 1, true, 3, 0, 1300 * ms, 0, "logged at 300"},
		{take, 500 * ms, 1, false, 3, 0, 1300 * ms, 500 * ms, "the entry at 0 must end first"},
		{peek, 999 * ms, 1, false, 3, 0, 1300 * ms, 1 * ms, "live until 1000 exclusive"},
		{peek, 1000 * ms, 1, true, 1, 2, 1300 * ms, 0, "the entry at 0 has ended"},
		{take, 1000 * ms, 2, true, 3, 0, 2000 * ms, 0, "logged at 1000"},
		{take, 200 * ms, 1, false, 3, 0, 2000 * ms, 1100 * ms, "a clock behind sees the entry from its future"},
		{refund, 1000 * ms, 2, true, 1, 2, 1300 * ms, 0, "refunds the newest entry first"},
		{take, 1300 * ms, 3, true, 3, 0, 2300 * ms, 0, "the entry at 300 ended at 1300"},
		{refund, 1400 * ms, 5, true, 0, 3, 2400 * ms, 0, "a refund above the count clamps to zero"},
	})
}

// testSlidingWindow: 10 per second, windows aligned to the epoch. T0 is 250
// ms into its window, so offset x from T0 is 250+x into that window.
func testSlidingWindow(t *testing.T, b throttler.Backend, key func(string) string) {
	require.Equal(t, int64(250), T0.UnixMilli()%1000, "the table assumes T0 is 250 ms into a second")
	p := throttler.Policy{Name: "sw", Limit: 10, Window: time.Second, Algorithm: throttler.SlidingWindow}
	const take, peek, refund = throttler.OpTake, throttler.OpPeek, throttler.OpRefund
	runRows(t, b, key("k"), p, []row{
		{take, 0, 4, true, 4, 6, 750 * ms, 0, "window K0, curr 4"},
		{take, 500 * ms, 6, true, 10, 0, 750 * ms, 0, "curr 10"},
		{take, 600 * ms, 1, false, 10, 0, 750 * ms, 250 * ms, "full: in the next window once 10 weighs 9"},
		{peek, 1000 * ms, 1, true, 8, 2, 1750 * ms, 0, "window K0+1, e=250: ceil(10*750/1000) = 8"},
		{take, 1000 * ms, 3, false, 8, 2, 1750 * ms, 50 * ms, "fits at e=300, when prev weighs 7"},
		{take, 1000 * ms, 2, true, 10, 0, 1750 * ms, 0, "curr 2, prev 10"},
		{take, 700 * ms, 1, false, 12, 0, 1750 * ms, 350 * ms, "a clock 50 ms behind is answered at the window's start"},
		{refund, 700 * ms, 1, false, 11, 0, 1750 * ms, 250 * ms, "a refund from behind still counts in window K"},
		{refund, 2000 * ms, 1, true, 1, 9, 2750 * ms, 0, "a refund in a later window stores nothing"},
		{peek, 1100 * ms, 1, true, 8, 2, 1750 * ms, 0, "so window K still holds curr 1"},
		{take, 3000 * ms, 1, true, 1, 9, 3750 * ms, 0, "two windows later both counts are 0"},
	})
}

// testWindowChange: a live bucket's or counter's state is scaled by the
// window that wrote it, so a policy whose Window changes starts afresh;
// a log's entries keep counting under the new window.
func testAlgorithmWindowChange(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	for _, a := range []throttler.Algorithm{throttler.TokenBucket, throttler.SlidingWindow, throttler.SlidingLog} {
		k := key(a.String())
		p := throttler.Policy{Name: "wchange", Limit: 3, Window: time.Second, Algorithm: a}
		for i := 0; i < 3; i++ {
			_, err := b.Take(ctx, k, p, 1, T0)
			require.NoError(t, err)
		}
		d, err := b.Peek(ctx, k, p, T0)
		require.NoError(t, err)
		require.False(t, d.Allowed, "%v: spent", a)
		p.Window = time.Minute
		d, err = b.Peek(ctx, k, p, T0.Add(ms))
		require.NoError(t, err)
		if a == throttler.SlidingLog {
			assert.Equal(t, int64(3), d.Used, "%v: the entries still count", a)
		} else {
			assert.Equal(t, int64(0), d.Used, "%v: a state of another window reads as none", a)
			assert.Less(t, d.RetryAfter, time.Minute, "%v: never a wait from a misread state", a)
		}
	}
}

// testAlgorithmsApart: one name and key under four algorithms is four
// limits.
func testAlgorithmsApart(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	for _, a := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow} {
		p := throttler.Policy{Name: "same", Limit: 2, Window: time.Minute, Algorithm: a}
		for i := int64(1); i <= 2; i++ {
			d, err := b.Take(ctx, k, p, 1, T0)
			require.NoError(t, err)
			require.True(t, d.Allowed, "%v take %d", a, i)
			require.Equal(t, i, d.Used, "%v shares state with another algorithm", a)
		}
	}
}

// testAlgorithmsConcurrent: 64 goroutines at one instant admit exactly the
// capacity, for every algorithm.
func testAlgorithmsConcurrent(t *testing.T, b throttler.Backend, key func(string) string) {
	for _, p := range []throttler.Policy{
		{Name: "c-tb", Limit: 10, Window: time.Hour, Algorithm: throttler.TokenBucket, Burst: 150},
		{Name: "c-sl", Limit: 150, Window: time.Hour, Algorithm: throttler.SlidingLog},
		{Name: "c-sw", Limit: 150, Window: time.Hour, Algorithm: throttler.SlidingWindow},
	} {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			k := key("hot")
			var admitted, errs atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 64; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 5; i++ {
						d, err := b.Take(context.Background(), k, p, 1, T0)
						if err != nil {
							errs.Add(1)
							continue
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.Zero(t, errs.Load())
			assert.Equal(t, p.Capacity(), admitted.Load(), "320 takes at one instant admit exactly the capacity")
		})
	}
}

// testDifferentialTraces runs random calls on a few keys under every
// algorithm, the clock jumping forward and back, and requires every
// Decision to equal the reference model's. A backend may have dropped a
// key's state that ended by the latest now it was given (DESIGN.md); a
// difference is accepted only if the model, dropping that state too, gives
// the backend's answer.
func testDifferentialTraces(t *testing.T, b throttler.Backend, key func(string) string) {
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	policies := []throttler.Policy{
		{Name: "d-fw", Limit: 4, Window: 90 * ms},
		{Limit: 5, Window: 100 * ms, Algorithm: throttler.TokenBucket, Burst: 8},
		{Name: "d-tb", Limit: 7, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 2},
		{Name: "d-sl", Limit: 6, Window: 80 * ms, Algorithm: throttler.SlidingLog},
		{Limit: 9, Window: 37 * ms, Algorithm: throttler.SlidingLog},
		{Name: "d-sw", Limit: 8, Window: 60 * ms, Algorithm: throttler.SlidingWindow},
		{Limit: 11, Window: 29 * ms, Algorithm: throttler.SlidingWindow},
	}
	keys := []string{key("a"), key("b"), key("c")}
	for seed := uint64(1); seed <= 2; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		m := NewModel()
		now := T0.UnixMilli() + int64(seed)*1_000_000 // traces apart in time
		latest := now
		for i := 0; i < steps; i++ {
			k, p := keys[rng.IntN(len(keys))], policies[rng.IntN(len(policies))]
			var op throttler.Op
			var cost int64
			now, op, cost = randomCall(rng, now, p)
			latest = max(latest, now)
			at := time.UnixMilli(now)
			got, err := backend.Do(context.Background(), b, op, k, p, cost, at)
			require.NoError(t, err)
			got.ResetAt = time.UnixMilli(got.ResetAt.UnixMilli())
			msg := fmt.Sprintf("seed %d step %d: %v %d of %q under %v at %d", seed, i, op, cost, k, p, now)
			want, commit := m.try(op, k, p, cost, now, false)
			if got != want {
				if end, ok := m.End(k, p); ok && end <= latest {
					want, commit = m.try(op, k, p, cost, now, true)
				}
			}
			require.Equal(t, want, got, msg)
			commit()
		}
	}
}

// randomCall moves a trace's clock (mostly a little forward, sometimes
// back as a caller whose clock is behind, sometimes far ahead) and picks an
// operation, Takes three times in five, and a cost up to p's capacity.
func randomCall(rng *rand.Rand, now int64, p throttler.Policy) (int64, throttler.Op, int64) {
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

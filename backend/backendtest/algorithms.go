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
	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
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

// runRows runs rows; a Refund's receipt is the ResetAt of the latest
// admitted Take of rows (T0+Window before any, a Take this key never saw).
func runRows(t *testing.T, b throttler.Backend, key string, p throttler.Policy, rows []row) {
	t.Helper()
	receipt := T0.Add(p.Window)
	for i, r := range rows {
		now := T0.Add(r.at)
		d, err := backend.Do(context.Background(), b, r.op, key, p, r.cost, receipt, now)
		if r.op == throttler.OpTake && d.Allowed {
			receipt = d.ResetAt
		}
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
// key's state that ended by the latest now it was given (docs/algorithms.md); a
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
		m := model.NewModel()
		rs := model.Receipts{}
		now := T0.UnixMilli() + int64(seed)*1_000_000 // traces apart in time
		latest := now
		for i := 0; i < steps; i++ {
			k, p := keys[rng.IntN(len(keys))], policies[rng.IntN(len(policies))]
			var op throttler.Op
			var cost int64
			now, op, cost = model.RandomCall(rng, now, p)
			latest = max(latest, now)
			at := time.UnixMilli(now)
			r := rs.Pick(rng, k, p, now)
			got, err := backend.Do(context.Background(), b, op, k, p, cost, time.UnixMilli(r), at)
			require.NoError(t, err)
			got.ResetAt = time.UnixMilli(got.ResetAt.UnixMilli())
			msg := fmt.Sprintf("seed %d step %d: %v %d of %q under %v at %d (receipt %d)", seed, i, op, cost, k, p, now, r)
			want, commit := m.Try(op, k, p, cost, r, now, false)
			if got != want {
				if end, ok := m.End(k, p); ok && end <= latest {
					want, commit = m.Try(op, k, p, cost, r, now, true)
				}
			}
			require.Equal(t, want, got, msg)
			commit()
			if op == throttler.OpTake && got.Allowed {
				rs.Add(k, p, got.ResetAt.UnixMilli())
			}
		}
	}
}

// receiptRow is one call at T0+at, a Refund naming the Take whose ResetAt
// is T0+of, and the whole Decision it must return.
type receiptRow struct {
	row
	of time.Duration
}

// testRefundReceipts: a Refund gives units back only to the state its
// receipt names. Two processes' clocks disagree: one ahead opens the next
// window (or refills the bucket, or logs entries) before the other sees its
// Take's window end, and the other's refund of that Take must then credit
// nothing new, while a refund with the new Take's receipt still refunds.
func testRefundReceipts(t *testing.T, b throttler.Backend, key func(string) string) {
	const take, peek, refund = throttler.OpTake, throttler.OpPeek, throttler.OpRefund
	m := time.Minute
	tests := []struct {
		name string
		p    throttler.Policy
		rows []receiptRow
	}{
		{"fixed window", throttler.Policy{Name: "rr-fw", Limit: 3, Window: m}, []receiptRow{
			{row{take, 0, 2, true, 2, 1, m, 0, "window A opens"}, 0},
			{row{refund, ms, 1, true, 1, 2, m, 0, "A's receipt refunds A"}, m},
			{row{take, m + 10*time.Second, 3, true, 3, 0, 2*m + 10*time.Second, 0, "a clock ahead opens window B"}, 0},
			{row{refund, m - ms, 1, false, 3, 0, 2*m + 10*time.Second, m + 10*time.Second + ms, "A's receipt from a clock behind credits nothing to B"}, m},
			{row{refund, m - ms, 2, true, 1, 2, 2*m + 10*time.Second, 0, "B's receipt refunds B, from any clock"}, 2*m + 10*time.Second},
			{row{refund, 2*m + 10*time.Second, 1, true, 0, 3, 3*m + 10*time.Second, 0, "B has ended: nothing stored"}, 2*m + 10*time.Second},
		}},
		// 2 tokens per second into a bucket of 4: a token takes 500 ms.
		{"token bucket", throttler.Policy{Name: "rr-tb", Limit: 2, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 4}, []receiptRow{
			{row{take, 0, 2, true, 2, 2, 1000 * ms, 0, "full again at 1000"}, 0},
			{row{refund, 100 * ms, 1, true, 1, 3, 500 * ms, 0, "before its receipt: a token back"}, 1000 * ms},
			{row{take, 2000 * ms, 4, true, 4, 0, 4000 * ms, 0, "a clock ahead: refilled to full, all taken, t0 = 2000"}, 0},
			{row{refund, 900 * ms, 1, false, 4, 0, 4000 * ms, 1600 * ms, "a clock behind, but t0 has passed the receipt: nothing"}, 1000 * ms},
			{row{refund, 900 * ms, 1, true, 3, 1, 3500 * ms, 0, "the later Take's receipt refunds"}, 4000 * ms},
			{row{take, 2000 * ms, 1, true, 4, 0, 4000 * ms, 0, "t0 stays 2000"}, 0},
			{row{take, 2100 * ms, 1, false, 4, 0, 4000 * ms, 400 * ms, "0.2 tokens"}, 0},
			{row{refund, 4000 * ms, 1, true, 0, 4, 4000 * ms, 0, "at its receipt the bucket is full again: nothing"}, 4000 * ms},
		}},
		{"token bucket, later takes", throttler.Policy{Name: "rr-tb2", Limit: 2, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 4}, []receiptRow{
			{row{take, 0, 1, true, 1, 3, 500 * ms, 0, "full again at 500"}, 0},
			{row{take, 400 * ms, 2, true, 3, 1, 1500 * ms, 0, "a later Take delays the refill to full"}, 0},
			{row{refund, 600 * ms, 1, true, 2, 2, 1500 * ms, 0, "the first Take's token came back by 500: nothing"}, 500 * ms},
			{row{refund, 600 * ms, 1, true, 1, 3, 1000 * ms, 0, "the second Take's refunds"}, 1500 * ms},
		}},
		// 10 per second, windows aligned to the epoch; T0 is 250 ms into
		// window K, which ends at +750.
		{"sliding-window counter", throttler.Policy{Name: "rr-sw", Limit: 10, Window: time.Second, Algorithm: throttler.SlidingWindow}, []receiptRow{
			{row{take, 0, 4, true, 4, 6, 750 * ms, 0, "window K"}, 0},
			{row{refund, 100 * ms, 1, true, 3, 7, 750 * ms, 0, "K's receipt refunds K"}, 750 * ms},
			{row{take, 800 * ms, 2, true, 5, 5, 1750 * ms, 0, "a clock ahead: window K+1, prev 3 weighs 3"}, 0},
			{row{refund, 700 * ms, 1, true, 5, 5, 1750 * ms, 0, "a clock behind is answered in K+1: K's receipt credits nothing"}, 750 * ms},
			{row{refund, 700 * ms, 2, true, 3, 7, 1750 * ms, 0, "K+1's receipt refunds K+1"}, 1750 * ms},
			{row{refund, 800 * ms, 1, true, 3, 7, 1750 * ms, 0, "a receipt that ends no window: nothing"}, 1700 * ms},
		}},
		{"sliding log", throttler.Policy{Name: "rr-sl", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog}, []receiptRow{
			{row{take, 0, 2, true, 2, 1, 1000 * ms, 0, "logged at 0"}, 0},
			{row{take, 600 * ms, 1, true, 3, 0, 1600 * ms, 0, "a clock ahead logs at 600"}, 0},
			{row{refund, 100 * ms, 1, true, 2, 1, 1600 * ms, 0, "the receipt 1000 takes from the entry at 0, not 600's"}, 1000 * ms},
			{row{refund, 100 * ms, 5, true, 1, 2, 1600 * ms, 0, "never more than the entries at or before 0 hold"}, 1000 * ms},
			{row{peek, 1100 * ms, 1, true, 1, 2, 1600 * ms, 0, "600's unit is still counted"}, 0},
			{row{take, 1100 * ms, 2, true, 3, 0, 2100 * ms, 0, "logged at 1100"}, 0},
			{row{refund, 1200 * ms, 1, true, 2, 1, 2100 * ms, 0, "600's receipt takes from 600, the newest at or before it"}, 1600 * ms},
			{row{refund, 1200 * ms, 1, true, 2, 1, 2100 * ms, 0, "0's receipt: its entries have ended, nothing"}, 1000 * ms},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := key("k")
			for i, r := range tc.rows {
				d, err := backend.Do(context.Background(), b, r.op, k, tc.p, r.cost, T0.Add(r.of), T0.Add(r.at))
				msg := fmt.Sprintf("row %d: %v %d at +%v, receipt +%v (%s)", i, r.op, r.cost, r.at, r.of, r.why)
				require.NoError(t, err, msg)
				want := throttler.Decision{Allowed: r.allowed, Limit: tc.p.Capacity(), Used: r.used, Remaining: r.remaining,
					ResetAt: time.UnixMilli(T0.Add(r.resetAt).UnixMilli()), RetryAfter: r.retry}
				d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli())
				require.Equal(t, want, d, msg)
			}
		})
	}
}

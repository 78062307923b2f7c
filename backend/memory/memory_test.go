package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) throttler.Backend { return newBackend(t, nil) })
}

func TestConformanceOneShard(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) throttler.Backend { return newBackend(t, &memory.Options{Shards: 1}) })
}

var t0 = backendtest.T0

func newBackend(t testing.TB, o *memory.Options) *memory.Backend {
	t.Helper()
	b, err := memory.New(o)
	require.NoError(t, err)
	return b
}

// monoClock is a monotonic clock the test moves (memory.SetMonotonic):
// cleanup advances no faster than it.
type monoClock struct{ d atomic.Int64 }

func (c *monoClock) read() time.Duration { return time.Duration(c.d.Load()) }
func (c *monoClock) set(d time.Duration) { c.d.Store(int64(d)) }

func newWithClock(t testing.TB, o *memory.Options) (*memory.Backend, *monoClock) {
	t.Helper()
	b := newBackend(t, o)
	c := &monoClock{}
	memory.SetMonotonic(b, c.read)
	return b, c
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  memory.Options
		field string
	}{
		{"negative shards", memory.Options{Shards: -1}, "Options.Shards"},
		{"too many shards", memory.Options{Shards: 1<<16 + 1}, "Options.Shards"},
		{"negative MaxKeys", memory.Options{MaxKeys: -1}, "Options.MaxKeys"},
		{"negative Lag", memory.Options{Lag: -time.Second}, "Options.Lag"},
		{"negative ClockHold", memory.Options{ClockHold: -time.Second}, "Options.ClockHold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := memory.New(&tc.opts)
			require.Error(t, err)
			assert.Nil(t, b)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
	b, err := memory.New(&memory.Options{Shards: 3, MaxKeys: 10})
	require.NoError(t, err)
	assert.NotNil(t, b)
}

// Ended windows are reclaimed by the now values callers pass, with no
// goroutine: once they ended Lag (1s) before every now a shard is given,
// and real time has passed as far.
func TestSweepFollowsCallersNow(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	p := throttler.Policy{Name: "p", Limit: 10, Window: time.Second}
	for i := 0; i < 500; i++ {
		_, err := b.Take(ctx, fmt.Sprint("old", i), p, 1, t0)
		require.NoError(t, err)
	}
	require.Equal(t, 500, b.Len())
	// Still inside the window: sweeping keeps everything.
	clock.set(500 * time.Millisecond)
	for i := 0; i < 2000; i++ {
		_, err := b.Take(ctx, "hot", p, 1, t0.Add(500*time.Millisecond))
		require.NoError(t, err)
	}
	assert.Equal(t, 501, b.Len(), "no window had ended")
	// Ended, but by less than Lag: kept for calls that lag.
	clock.set(1900 * time.Millisecond)
	for i := 0; i < 3000; i++ {
		_, err := b.Peek(ctx, "hot", p, t0.Add(1900*time.Millisecond))
		require.NoError(t, err)
	}
	assert.Equal(t, 501, b.Len(), "ended less than Lag ago")
	// Once callers pass a now Lag after the windows ended, they go.
	clock.set(3 * time.Second)
	for i := 0; i < 2000; i++ {
		_, err := b.Peek(ctx, "hot", p, t0.Add(3*time.Second))
		require.NoError(t, err)
		_, err = b.Refund(ctx, "hot", p, 1, t0.Add(p.Window), t0.Add(3*time.Second))
		require.NoError(t, err)
	}
	assert.Equal(t, 0, b.Len(), "ended windows were reclaimed")
}

// A full table never refuses a rate limit's key: it evicts the least
// recently used state to the second tier, which keeps what it counted.
func TestMaxKeys(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1, MaxKeys: 3})
	p := throttler.Policy{Name: "p", Limit: 10, Window: time.Second}
	for _, k := range []string{"a", "b", "c"} {
		d, err := b.Take(ctx, k, p, 1, t0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := b.Take(ctx, "d", p, 1, t0)
	require.NoError(t, err, "a full table makes room")
	assert.Equal(t, int64(1), d.Used)
	assert.Equal(t, 3, b.Len())
	assert.Equal(t, uint64(1), b.Stats().Evictions)
	for _, k := range []string{"a", "b", "c", "d"} {
		d, err = b.Take(ctx, k, p, 1, t0)
		require.NoError(t, err, "existing keys keep counting when full")
		assert.Equal(t, int64(2), d.Used, "%s: evicted or not, its window kept its count", k)
		assert.Equal(t, t0.Add(time.Second).UnixMilli(), d.ResetAt.UnixMilli(), k)
	}
	assert.Equal(t, 3, b.Len())
	assert.NotZero(t, b.Stats().SecondTierHits)
	d, err = b.Peek(ctx, "e", p, t0)
	require.NoError(t, err, "Peek stores nothing, so it works when full")
	assert.True(t, d.Allowed)
	assert.Zero(t, d.Used)

	// Once the windows ended Lag before the clock, they go without a call.
	clock.set(3 * time.Second)
	_, err = b.Peek(ctx, "e", p, t0.Add(3*time.Second))
	require.NoError(t, err)
	memory.SweepAll(b)
	assert.Zero(t, b.Len())
}

// Once every state has ended, the tables give their memory back with no
// call to drive it: after 100,000 keys whose windows ended, a sweep of the
// sweeper (as its timer makes it) leaves nothing held and the heap at its
// baseline, on every algorithm.
func TestIdleTablesShrink(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b, clock := newWithClock(t, nil)
			p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second, Algorithm: alg}
			const keys = 100_000
			for i := range keys { // over 2 s, the callers' clock keeping pace with real time
				at := time.Duration(i) * 2 * time.Second / keys
				clock.set(at)
				_, err := b.Take(ctx, "client-"+strconv.Itoa(i), p, 1, t0.Add(at))
				require.NoError(t, err)
			}
			held := b.Stats().Bytes
			clock.set(5 * time.Second) // every state ended (a counter pair two windows on), and Lag
			memory.SweepAll(b)
			st := b.Stats()
			assert.Zero(t, st.Keys)
			assert.Zero(t, st.Bytes, "of %d bytes held at the peak", held)
			runtime.GC()
			runtime.ReadMemStats(&after)
			grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("heap %+d bytes over the baseline; %d held at the peak", grew, held)
			assert.Less(t, grew, int64(1<<20), "heap over the baseline once idle")
			runtime.KeepAlive(b)
		})
	}
}

// When most states have ended and a few live on, two sweeps without calls
// shrink the tables to what the few need: their slots, and for logs the
// array beside the slots.
func TestTablesShrinkToTheLiveStates(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			b, clock := newWithClock(t, nil)
			short := throttler.Policy{Name: "short", Limit: 5, Window: time.Second, Algorithm: alg}
			long := throttler.Policy{Name: "long", Limit: 5, Window: time.Hour, Algorithm: alg}
			const keys, live = 100_000, 1000
			for i := range keys {
				at := time.Duration(i) * 2 * time.Second / keys
				clock.set(at)
				p := short
				if i%(keys/live) == 0 {
					p = long
				}
				_, err := b.Take(ctx, "client-"+strconv.Itoa(i), p, 1, t0.Add(at))
				require.NoError(t, err)
			}
			peak := b.Stats().Bytes
			clock.set(5 * time.Second)
			memory.SweepAll(b)
			clock.set(6 * time.Second)
			memory.SweepAll(b)
			st := b.Stats()
			assert.Equal(t, live, st.Keys)
			t.Logf("%d bytes held for %d states, %d at the peak", st.Bytes, st.Keys, peak)
			assert.Less(t, st.Bytes*20, peak, "under 5%% of the peak")
			for i := 0; i < keys; i += keys / live {
				d, err := b.Peek(ctx, "client-"+strconv.Itoa(i), long, t0.Add(6*time.Second))
				require.NoError(t, err)
				require.Equal(t, int64(1), d.Used, "client-%d", i)
			}
		})
	}
}

func TestRefusedTakeStoresNothing(t *testing.T) {
	b := newBackend(t, nil)
	p := throttler.Policy{Limit: 1, Window: time.Second}
	_, err := b.Take(context.Background(), "k", p, 2, t0)
	require.ErrorIs(t, err, throttler.ErrInvalidCost)
	assert.Equal(t, 0, b.Len())
}

func TestCloseEmpties(t *testing.T) {
	b := newBackend(t, nil)
	p := throttler.Policy{Limit: 1, Window: time.Second}
	_, err := b.Take(context.Background(), "k", p, 1, t0)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	assert.Equal(t, 0, b.Len())
	assert.False(t, errors.Is(err, memory.ErrFull))
}

func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("client-", i)
	}
	for _, bc := range []struct {
		name string
		keys []string
	}{{"HotKey", keys[:1]}, {"100kKeys", keys}} {
		b.Run(bc.name, func(b *testing.B) {
			m := newBackend(b, nil)
			for _, k := range bc.keys {
				_, _ = m.Take(ctx, k, p, 1, t0)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := m.Take(ctx, bc.keys[i%len(bc.keys)], p, 1, t0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/Parallel", func(b *testing.B) {
			m := newBackend(b, nil)
			for _, k := range bc.keys {
				_, _ = m.Take(ctx, k, p, 1, t0)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := m.Take(ctx, bc.keys[i%len(bc.keys)], p, 1, t0); err != nil {
						b.Fatal(err)
					}
					i += 7919
				}
			})
		})
	}
}

// A key's windows under several policies are reclaimed one by one: the
// long window survives the sweep that drops the short ones.
func TestSweepKeepsLiveWindowsOfAKey(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	short1 := throttler.Policy{Name: "s1", Limit: 10, Window: time.Second}
	short2 := throttler.Policy{Name: "s2", Limit: 10, Window: time.Second}
	long := throttler.Policy{Name: "long", Limit: 10, Window: time.Hour}
	for i := 0; i < 100; i++ {
		k := fmt.Sprint("k", i)
		for _, p := range []throttler.Policy{short1, long, short2} {
			_, err := b.Take(ctx, k, p, 3, t0)
			require.NoError(t, err)
		}
	}
	require.Equal(t, 300, b.Len())
	clock.set(time.Minute)
	for i := 0; i < 2000; i++ {
		_, err := b.Refund(ctx, "other", long, 1, t0.Add(time.Hour), t0.Add(time.Minute))
		require.NoError(t, err)
	}
	assert.Equal(t, 100, b.Len(), "only the long windows are left")
	for i := 0; i < 100; i++ {
		k := fmt.Sprint("k", i)
		d, err := b.Peek(ctx, k, long, t0.Add(time.Minute))
		require.NoError(t, err)
		assert.Equal(t, int64(3), d.Used, k)
		d, err = b.Take(ctx, k, short2, 1, t0.Add(time.Minute))
		require.NoError(t, err)
		assert.Equal(t, int64(1), d.Used, "%s: a fresh short window", k)
	}
	assert.Equal(t, 200, b.Len())
}

// The backend keeps its own copy of a key: a caller may build keys in a
// buffer it reuses.
func TestKeysAreCopied(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, nil)
	p := throttler.Policy{Limit: 1, Window: time.Minute}
	buf := []byte("alice")
	key := unsafe.String(&buf[0], len(buf)) // shares buf, as zero-copy HTTP servers do
	_, err := b.Take(ctx, key, p, 1, t0)
	require.NoError(t, err)
	copy(buf, "bob00")
	d, err := b.Peek(ctx, "alice", p, t0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "alice's window survives the buffer's reuse")
	d, err = b.Peek(ctx, "bob00", p, t0)
	require.NoError(t, err)
	assert.Equal(t, int64(0), d.Used)
}

// BenchmarkAlgorithms: each algorithm's Take of one unit on a hot key, the
// clock moving a ms per call and every call admitted.
func BenchmarkAlgorithms(b *testing.B) {
	for _, c := range algorithmCases() {
		b.Run(c.name, func(b *testing.B) {
			take := c.setup(b)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				take(i)
			}
		})
	}
}

type algorithmCase struct {
	name  string
	setup func(b *testing.B) func(i int) // returns the i-th call
}

// algorithmCases are the hot-key Takes the benchmarks time. Windows are
// long enough that each call is admitted and short enough that state moves
// on: a sliding-window counter changes windows every 1,000 calls (so the
// previous count weighs in), a log of 100 ms drops an ended entry and adds
// one on every call, and a log of 10 s holds 10,000 live entries, full
// after each Take: its cost must not grow with them.
func algorithmCases() []algorithmCase {
	policies := []struct {
		name string
		p    throttler.Policy
	}{
		{"fixed-window", throttler.Policy{Name: "fw", Limit: 1 << 40, Window: time.Hour}},
		{"token-bucket", throttler.Policy{Name: "tb", Limit: 1 << 30, Window: time.Hour, Algorithm: throttler.TokenBucket}},
		{"sliding-window", throttler.Policy{Name: "sw", Limit: 1 << 30, Window: time.Second, Algorithm: throttler.SlidingWindow}},
		{"sliding-log", throttler.Policy{Name: "sl", Limit: throttler.MaxLogLimit, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}},
		{"sliding-log-10k-live", throttler.Policy{Name: "sl", Limit: throttler.MaxLogLimit, Window: 10 * time.Second, Algorithm: throttler.SlidingLog}},
	}
	cases := make([]algorithmCase, len(policies))
	for i, pc := range policies {
		p := pc.p
		cases[i] = algorithmCase{pc.name, func(b *testing.B) func(int) {
			m := newBackend(b, nil)
			ctx := context.Background()
			take := func(i int) {
				d, err := m.Take(ctx, "hot", p, 1, t0.Add(time.Duration(i)*time.Millisecond))
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			// Warm up: a full log, a window with a previous count.
			for i := -20_000; i < 0; i++ {
				take(i)
			}
			return take
		}}
	}
	return cases
}

// BenchmarkAlgorithmsInterleaved runs the algorithms' hot-key Takes (the
// calls of BenchmarkAlgorithms) in rounds, each algorithm a turn of 1,000
// calls per round, and reports the median over rounds of each one's cost
// per Take and of its ratio to the fixed window's in the same round: on a
// shared machine only figures taken side by side compare, and the median
// drops the rounds that other work disturbed. The cost is the thread's own
// CPU time (the goroutine is locked to it), which other processes' load
// inflates less than the wall clock.
func BenchmarkAlgorithmsInterleaved(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cases := algorithmCases()
	takes := make([]func(i int), len(cases))
	for a, c := range cases {
		takes[a] = c.setup(b)
	}
	const turn = 1000
	costs := make([][]float64, len(cases)) // per round, ns per Take
	i := 0
	for b.Loop() {
		for a, take := range takes {
			start := cputime.Thread()
			for j := i; j < i+turn; j++ {
				take(j)
			}
			costs[a] = append(costs[a], float64(cputime.Thread()-start)/turn)
		}
		i += turn
	}
	for a, c := range cases {
		b.ReportMetric(median(costs[a]), c.name+"-cpu-ns/op")
		if a > 0 {
			ratios := make([]float64, len(costs[a]))
			for r := range ratios {
				ratios[r] = costs[a][r] / costs[0][r]
			}
			b.ReportMetric(median(ratios), c.name+"/fixed")
		}
	}
	b.ReportMetric(0, "ns/op")
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// A shard remembers the last policy it validated; a policy that differs in
// any field is validated again, so a bad one is refused even right after
// a good one of the same name.
func TestValidationIsNotMemoisedAcrossPolicies(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, &memory.Options{Shards: 1})
	good := throttler.Policy{Name: "p", Limit: 10, Window: time.Second}
	for _, bad := range []throttler.Policy{
		{Name: "p", Limit: 0, Window: time.Second},
		{Name: "p", Limit: 10, Window: time.Second + time.Microsecond},
		{Name: "p", Limit: 10, Window: time.Second, Burst: 5},
		{Name: "p", Limit: 10, Window: time.Second, Algorithm: 9},
	} {
		_, err := b.Take(ctx, "k", good, 1, t0)
		require.NoError(t, err)
		_, err = b.Take(ctx, "k", bad, 1, t0)
		require.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%+v", bad)
		_, err = b.Peek(ctx, "k", bad, t0)
		require.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%+v", bad)
	}
	_, err := b.Take(ctx, "k", good, 11, t0)
	require.ErrorIs(t, err, throttler.ErrInvalidCost, "the cost is checked on a remembered policy")
	_, err = b.Refund(ctx, "k", good, 1, time.Time{}, t0)
	require.ErrorIs(t, err, throttler.ErrInvalidReceipt)
	_, err = b.Take(ctx, "", good, 1, t0)
	require.ErrorIs(t, err, throttler.ErrInvalidKey)
}

// On a remembered policy a call checks its key's length and its cost
// against numbers, not with the validators: every call gets exactly the
// error ValidateCall gives, at each bound.
func TestRememberedPolicyChecksAsValidateCall(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, &memory.Options{Shards: 1})
	// A bucket whose Capacity (its Burst) is not its Limit.
	p := throttler.Policy{Name: "p", Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 20}
	keys := []string{"", "k", strings.Repeat("k", throttler.MaxKeyLen), strings.Repeat("k", throttler.MaxKeyLen+1)}
	costs := []int64{math.MinInt64, -1, 0, 1, 10, 20, 21, throttler.MaxLimit, throttler.MaxLimit + 1, math.MaxInt64}
	receipt := t0.Add(time.Second)
	same := func(want, got error, what string) {
		t.Helper()
		if want == nil {
			require.NoError(t, got, what)
			return
		}
		require.EqualError(t, got, want.Error(), what)
	}
	for _, key := range keys {
		for _, cost := range costs {
			what := fmt.Sprintf("key of %d bytes, cost %d", len(key), cost)
			_, err := b.Peek(ctx, "k", p, t0) // the shard remembers p
			require.NoError(t, err)
			_, err = b.Take(ctx, key, p, cost, t0)
			same(throttler.ValidateCall(throttler.OpTake, key, p, cost, time.Time{}), err, "Take, "+what)
			_, err = b.Peek(ctx, key, p, t0)
			same(throttler.ValidateCall(throttler.OpPeek, key, p, cost, time.Time{}), err, "Peek, "+what)
			_, err = b.Refund(ctx, key, p, cost, receipt, t0)
			same(throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt), err, "Refund, "+what)
			_, err = b.Refund(ctx, key, p, cost, time.Time{}, t0)
			same(throttler.ValidateCall(throttler.OpRefund, key, p, cost, time.Time{}), err, "Refund without receipt, "+what)
		}
	}
}

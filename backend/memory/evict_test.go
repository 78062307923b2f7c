package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var algorithms = []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow}

// A table much smaller than its keys, on every algorithm: every Take it
// admits, a backend with room for every key admits too when given only
// the admitted Takes (so it never admits a unit over the limit). Keys come
// and go at random
// over a few windows, so states are evicted, merged in shared cells and
// brought back many times.
func TestEvictionNeverUnderCounts(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second, Algorithm: alg}
			small, clockS := newWithClock(t, &memory.Options{Shards: 2, MaxKeys: 32})
			exact, clockE := newWithClock(t, nil)
			rng := rand.New(rand.NewPCG(3, uint64(alg)))
			now := t0
			var takes, admitted, falseDenials int
			for i := 0; i < 40_000; i++ {
				now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
				clockS.set(now.Sub(t0))
				clockE.set(now.Sub(t0))
				k := fmt.Sprint("k", rng.IntN(64))
				cost := int64(1 + rng.IntN(2))
				d, err := small.Take(ctx, k, p, cost, now)
				require.NoError(t, err)
				takes++
				if d.Allowed {
					admitted++
					e, err := exact.Take(ctx, k, p, cost, now)
					require.NoError(t, err)
					require.True(t, e.Allowed, "step %d: %s admitted %d beyond its limit (exact: %+v)", i, k, cost, e)
					continue
				}
				e, err := exact.Peek(ctx, k, p, now)
				require.NoError(t, err)
				if e.Remaining >= cost {
					falseDenials++
				}
			}
			st := small.Stats()
			t.Logf("%d takes, %d admitted, %d false denials; %d evictions, %d second-tier hits",
				takes, admitted, falseDenials, st.Evictions, st.SecondTierHits)
			assert.NotZero(t, st.Evictions)
			assert.NotZero(t, st.SecondTierHits)
			assert.LessOrEqual(t, st.Keys, 32)
			// Twice as many keys as room, drawn at random (no client
			// calls more than another): about half the cells are shared,
			// and deny what the exact backend would admit. The flood test
			// bounds false denials for clients that call again.
		})
	}
}

// An evicted state that returns answers as it would have in the table: a
// fixed window's count and ResetAt, a counter pair's, exactly; a bucket at
// most a ms of refill short; a log's units until its newest entry ends.
func TestEvictedStateReturns(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			p := throttler.Policy{Name: "p", Limit: 10, Window: time.Minute, Algorithm: alg}
			small := newBackend(t, &memory.Options{Shards: 1, MaxKeys: 1})
			exact := newBackend(t, nil)
			for _, b := range []*memory.Backend{small, exact} {
				_, err := b.Take(ctx, "client", p, 4, t0)
				require.NoError(t, err)
				_, err = b.Take(ctx, "client", p, 3, t0.Add(20*time.Second))
				require.NoError(t, err)
			}
			_, err := small.Take(ctx, "other", p, 1, t0.Add(20*time.Second)) // evicts client
			require.NoError(t, err)
			require.Equal(t, uint64(1), small.Stats().Evictions)
			at := t0.Add(30 * time.Second)
			want, err := exact.Peek(ctx, "client", p, at)
			require.NoError(t, err)
			got, err := small.Peek(ctx, "client", p, at)
			require.NoError(t, err)
			switch alg {
			case throttler.FixedWindow, throttler.SlidingWindow:
				assert.Equal(t, want, got)
			case throttler.TokenBucket:
				assert.Equal(t, want.Remaining, got.Remaining)
				assert.Equal(t, want.ResetAt, got.ResetAt)
			case throttler.SlidingLog:
				assert.Equal(t, int64(7), got.Used, "every unit held")
				assert.Equal(t, t0.Add(80*time.Second).UnixMilli(), got.ResetAt.UnixMilli(), "until the newest entry ends")
			}
			// Brought back by a Take, it counts on from there.
			for _, cost := range []int64{3, 1} {
				want, err := exact.Take(ctx, "client", p, cost, at)
				require.NoError(t, err)
				got, err := small.Take(ctx, "client", p, cost, at)
				require.NoError(t, err)
				if alg != throttler.SlidingLog {
					assert.Equal(t, want.Allowed, got.Allowed, "cost %d", cost)
				} else if got.Allowed {
					assert.True(t, want.Allowed, "cost %d", cost)
				}
			}
		})
	}
}

// floodFigures is what a flood of distinct keys did to the clients of a
// backend with the default bound.
type floodFigures struct {
	flood, clientTakes, newTakes        int
	clientOver, newOver                 int // units admitted beyond the limit
	clientFalseDenials, newFalseDenials int
	errors                              int
	heapMiB, evictions, secondTierHits  uint64
	keysHeld                            int
	bytesHeld                           int64 // Stats().Bytes
}

// runFlood floods a backend of options o with n distinct keys, each taking the
// whole limit of an hourly policy, over ten minutes of the callers' clock
// moving with real time. From two minutes before the flood, 1,000 clients
// take a unit a minute, and every 10 s a new client takes 20 units at
// once. Each is checked against a backend with room for them alone:
// admitted there too (no unit over), or denied there too (else a false
// denial). With keyLen set, every key is padded at its front to that many
// bytes.
func runFlood(t testing.TB, o *memory.Options, alg throttler.Algorithm, n, keyLen int) floodFigures {
	ctx := context.Background()
	padding := strings.Repeat("k", keyLen)
	pad := func(k string) string {
		if len(k) < keyLen {
			return padding[:keyLen-len(k)] + k
		}
		return k
	}
	p := throttler.Policy{Name: "hourly", Limit: 10, Window: time.Hour, Algorithm: alg}
	b, clock := newWithClock(t, o)
	defer b.Close()
	exact, clockE := newWithClock(t, nil)
	defer exact.Close()
	var f floodFigures
	f.flood = n
	check := func(k string, cost int64, now time.Time, over, falseDenials *int) {
		k = pad(k)
		d, err := b.Take(ctx, k, p, cost, now)
		if err != nil {
			f.errors++
			return
		}
		if d.Allowed {
			if e, _ := exact.Take(ctx, k, p, cost, now); !e.Allowed {
				*over += int(cost)
			}
		} else if e, _ := exact.Peek(ctx, k, p, now); e.Remaining >= cost {
			*falseDenials++
		}
	}
	const span = 10 * time.Minute
	const clients = 1000
	step := span / time.Duration(n)
	warm := int(2 * time.Minute / step) // the clients' calls before the flood
	newClient := 0
	for i := 0; i < warm+n; i++ {
		at := time.Duration(i) * step
		clock.set(at)
		clockE.set(at)
		now := t0.Add(at)
		if i >= warm {
			if _, err := b.Take(ctx, pad("flood-"+strconv.Itoa(i-warm)), p, p.Limit, now); err != nil {
				f.errors++
			}
		}
		// Client c calls at c·60ms past each minute.
		if prev := time.Duration(i-1) * step; i > 0 && prev/(60*time.Millisecond) != at/(60*time.Millisecond) {
			c := int(at/(60*time.Millisecond)) % clients
			check("client-"+strconv.Itoa(c), 1, now, &f.clientOver, &f.clientFalseDenials)
			f.clientTakes++
		}
		if prev := time.Duration(i-1) * step; i > 0 && prev/(10*time.Second) != at/(10*time.Second) {
			k := "new-" + strconv.Itoa(newClient)
			newClient++
			for range 20 {
				check(k, 1, now, &f.newOver, &f.newFalseDenials)
				f.newTakes++
			}
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f.heapMiB = ms.HeapAlloc >> 20
	st := b.Stats()
	f.evictions, f.secondTierHits, f.keysHeld, f.bytesHeld = st.Evictions, st.SecondTierHits, st.Keys, st.Bytes
	runtime.KeepAlive(b)
	return f
}

// A flood of distinct keys, each spending the whole limit: no call fails
// (so no failure mode admits anyone unlimited), no client or newcomer gets
// a unit over its limit, and few are denied what the exact backend would
// admit. Scaled down here (a bound of 16,384 keys, a flood of 100,000);
// THROTTLEKIT_FLOOD_KEYS=10000000 floods the defaults with that many and
// also checks that the heap stays under 256 MiB.
func TestKeyFlood(t *testing.T) {
	o, n, bound := &memory.Options{MaxKeys: 16384}, 100_000, 16384
	full := os.Getenv("THROTTLEKIT_FLOOD_KEYS")
	if full != "" {
		var err error
		o, bound = nil, memory.DefaultMaxKeys
		n, err = strconv.Atoi(full)
		require.NoError(t, err)
	}
	algs := algorithms
	if testing.Short() {
		algs = algs[:1]
	}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			f := runFlood(t, o, alg, n, 0)
			t.Logf("%+v", f)
			assert.Zero(t, f.errors)
			assert.Zero(t, f.clientOver)
			assert.Zero(t, f.newOver)
			assert.LessOrEqual(t, f.keysHeld, bound)
			assert.NotZero(t, f.evictions)
			assert.LessOrEqual(t, f.clientFalseDenials*50, f.clientTakes, "at most 2% of the clients' takes")
			assert.LessOrEqual(t, f.newFalseDenials*50, f.newTakes, "at most 2% of the newcomers' takes")
			if full != "" {
				assert.Less(t, f.heapMiB, uint64(256))
			}
		})
	}
}

// Keys of throttler.MaxKeyLen bytes cost a state no more than short ones:
// 300,000 distinct 4,096-byte keys under the defaults keep the live heap
// under 256 MiB, with every call answered, no unit over any client's or
// newcomer's limit and few false denials. The figure is in
// docs/backends-memory.md (go test -run TestLongKeyFlood -v ./backend/memory);
// THROTTLEKIT_FLOOD_KEYS sets another number of keys (past the default
// bound, shards evict).
func TestLongKeyFlood(t *testing.T) {
	n := 300_000
	if v := os.Getenv("THROTTLEKIT_FLOOD_KEYS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	algs := algorithms
	if testing.Short() {
		algs = algs[:1]
	}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			f := runFlood(t, nil, alg, n, throttler.MaxKeyLen)
			t.Logf("%+v (heap %d MiB, Stats().Bytes %d MiB)", f, f.heapMiB, f.bytesHeld>>20)
			assert.Zero(t, f.errors)
			assert.Zero(t, f.clientOver)
			assert.Zero(t, f.newOver)
			assert.LessOrEqual(t, f.clientFalseDenials*50, f.clientTakes, "at most 2% of the clients' takes")
			assert.LessOrEqual(t, f.newFalseDenials*50, f.newTakes, "at most 2% of the newcomers' takes")
			assert.Less(t, f.heapMiB, uint64(256), "live heap, MiB")
			assert.Less(t, f.bytesHeld, int64(256<<20), "Stats().Bytes")
		})
	}
}

// The sweeper reclaims ended state with no call to drive it, and Close
// stops it, leaving no goroutine.
func TestSweeperReclaimsWithoutCallsAndCloseStopsIt(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	b, err := memory.New(&memory.Options{SweepEvery: time.Millisecond, Lag: time.Millisecond})
	require.NoError(t, err)
	clock := &monoClock{}
	memory.SetMonotonic(b, clock.read)
	p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second}
	for i := 0; i < 10_000; i++ { // over 20 ms, the callers' clock keeping pace with real time
		at := time.Duration(i/500) * time.Millisecond
		clock.set(at)
		_, err := b.Take(ctx, fmt.Sprint("k", i), p, 1, t0.Add(at))
		require.NoError(t, err)
	}
	// Real time (as the backend reads it) passes the windows' end: the
	// sweeper drops them, and stops once nothing is held.
	clock.set(2 * time.Second)
	require.Eventually(t, func() bool { return b.Len() == 0 }, 10*time.Second, time.Millisecond)
	_, err = b.Take(ctx, "again", p, 1, t0.Add(2*time.Second))
	require.NoError(t, err, "a store after the sweeper stopped arms it again")
	clock.set(4 * time.Second)
	require.Eventually(t, func() bool { return b.Len() == 0 }, 10*time.Second, time.Millisecond)
	_, err = b.Take(ctx, "held", throttler.Policy{Name: "h", Limit: 5, Window: time.Hour}, 1, t0.Add(4*time.Second))
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

// The sweeper trusts the clock as calls do: a state live by the clock the
// calls showed is kept by a sweep without calls, however far the last call
// leapt (ClockHold).
func TestSweeperKeepsToTheClockGuard(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	_, err := b.Take(ctx, "client", hourly, 10, t0)
	require.NoError(t, err)
	clock.set(time.Second)
	_, err = b.Take(ctx, "stray", hourly, 1, t0.Add(24*time.Hour))
	require.NoError(t, err)
	memory.SweepAll(b)
	clock.set(2 * time.Second)
	memory.SweepAll(b)
	requireExhausted(t, b, 0, t0)
	d, err := b.Take(ctx, "client", hourly, 1, t0.Add(2*time.Second))
	require.NoError(t, err)
	assert.False(t, d.Allowed)
}

// A sweep without a call keeps what a call trailing the clock by up to Lag
// still needs: a call that did not lag is no licence to trust the clock
// Lag ahead of it. Each algorithm's state ends 100 ms before real time (as
// the backend reads it) reaches it plus 100 ms; the sweeper runs; a call
// 100 ms behind that clock must find the state a twin that never swept
// finds.
func TestSweepKeepsStateForACallWithinLag(t *testing.T) {
	ctx := context.Background()
	for _, p := range []throttler.Policy{
		{Name: "fw", Limit: 3, Window: time.Second},
		{Name: "tb", Limit: 3, Window: time.Second, Algorithm: throttler.TokenBucket},
		{Name: "sl", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog},
		{Name: "sw", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingWindow},
	} {
		t.Run(p.Name, func(t *testing.T) {
			swept, clock := newWithClock(t, &memory.Options{Shards: 1})
			twin, twinClock := newWithClock(t, &memory.Options{Shards: 1})
			start := t0.Add(time.Second)
			clock.set(time.Second)
			twinClock.set(time.Second)
			d, err := swept.Take(ctx, "k", p, 1, start)
			require.NoError(t, err)
			_, err = twin.Take(ctx, "k", p, 1, start)
			require.NoError(t, err)
			end := d.ResetAt // a counter's pair lasts a window more
			if p.Algorithm == throttler.SlidingWindow {
				end = end.Add(p.Window)
			}
			clock.set(end.Add(100 * time.Millisecond).Sub(t0))
			memory.SweepAll(swept)
			at := end.Add(-time.Millisecond) // 101 ms behind the clock, within Lag (1s)
			want, err := twin.Peek(ctx, "k", p, at)
			require.NoError(t, err)
			got, err := swept.Peek(ctx, "k", p, at)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

package memory_test

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
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// Cleanup never deletes state that is live for a now the backend
// will still be asked about. Each test drives one shard (Shards: 1) with
// enough calls for many sweeps, and moves the monotonic clock as real time
// would pass.

var hourly = throttler.Policy{Name: "hourly", Limit: 10, Window: time.Hour}

// exhaust spends every client's hour at t0.
func exhaust(t *testing.T, b *memory.Backend, clients int) {
	t.Helper()
	for c := 0; c < clients; c++ {
		d, err := b.Take(context.Background(), fmt.Sprint("client", c), hourly, hourly.Limit, t0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
}

// requireExhausted: every client is still denied at now, its hour intact.
func requireExhausted(t *testing.T, b *memory.Backend, clients int, now time.Time) {
	t.Helper()
	admitted := 0
	for c := 0; c < clients; c++ {
		d, err := b.Take(context.Background(), fmt.Sprint("client", c), hourly, 1, now)
		require.NoError(t, err)
		if d.Allowed || d.Used != hourly.Limit || !d.ResetAt.Equal(t0.Add(time.Hour)) {
			admitted++
		}
	}
	assert.Zero(t, admitted, "exhausted clients that got a fresh window")
}

// traffic makes n calls on other keys at now, real time at mono.
func traffic(t *testing.T, b *memory.Backend, clock *monoClock, n int, now time.Time, mono time.Duration) {
	t.Helper()
	clock.set(mono)
	for i := 0; i < n; i++ {
		_, err := b.Take(context.Background(), fmt.Sprint("other", i%50), hourly, 1, now)
		require.NoError(t, err)
	}
}

// Case 1: one call with a now a year ahead (a bad NTP sync) used to make
// every later sweep delete the open windows.
func TestFarFutureNowDeletesNothing(t *testing.T) {
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	exhaust(t, b, 200)
	clock.set(time.Second)
	_, err := b.Take(context.Background(), "stray", hourly, 1, t0.Add(365*24*time.Hour))
	require.NoError(t, err)
	traffic(t, b, clock, 5000, t0.Add(time.Minute), time.Minute)
	requireExhausted(t, b, 200, t0.Add(2*time.Minute))
}

// Case 1: after the clock stepped forward a day and back, every exhausted
// client used to be admitted again. Cleanup follows a stepped clock only
// as fast as real time passes; once the step has lasted ClockHold, it
// trusts the new clock.
func TestClockSteppedForwardAndBack(t *testing.T) {
	b, clock := newWithClock(t, &memory.Options{Shards: 1, ClockHold: 10 * time.Minute})
	exhaust(t, b, 200)
	traffic(t, b, clock, 2000, t0.Add(time.Second), time.Second) // the clock as it was
	day := 24 * time.Hour
	traffic(t, b, clock, 5000, t0.Add(day), 2*time.Second) // stepped forward
	traffic(t, b, clock, 5000, t0.Add(day+time.Minute), time.Minute)
	requireExhausted(t, b, 200, t0.Add(time.Minute)) // and back

	// The step lasts: cleanup keeps to the old clock's pace for
	// ClockHold, then follows the new one.
	traffic(t, b, clock, 5000, t0.Add(day+2*time.Minute), 2*time.Minute)
	assert.GreaterOrEqual(t, b.Len(), 200, "the old windows, live by the old clock, stay")
	traffic(t, b, clock, 5000, t0.Add(day+25*time.Minute), 25*time.Minute)
	traffic(t, b, clock, 5000, t0.Add(day+26*time.Minute), 26*time.Minute)
	assert.Less(t, b.Len(), 200, "after 2·ClockHold the new clock is trusted")
}

// A clock stepped forward reclaims only as fast as real time passes.
func TestForwardStepReclaimsAtRealTimePace(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	p := throttler.Policy{Name: "minute", Limit: 5, Window: time.Minute}
	for i := 0; i < 100; i++ {
		_, err := b.Take(ctx, fmt.Sprint("k", i), p, 3, t0)
		require.NoError(t, err)
	}
	traffic(t, b, clock, 2000, t0.Add(time.Second), time.Second)
	// An hour ahead of the clock, 30 s later in real time: the windows
	// (ending at t0+1m) are still live for the old clock.
	traffic(t, b, clock, 5000, t0.Add(time.Hour), 30*time.Second)
	for i := 0; i < 100; i++ {
		d, err := b.Peek(ctx, fmt.Sprint("k", i), p, t0.Add(40*time.Second))
		require.NoError(t, err)
		require.Equal(t, int64(3), d.Used, "k%d", i)
	}
	// Real time has passed their end (and Lag): they go.
	traffic(t, b, clock, 5000, t0.Add(time.Hour+time.Minute), 90*time.Second)
	d, err := b.Peek(ctx, "k7", p, t0.Add(40*time.Second))
	require.NoError(t, err)
	assert.Zero(t, d.Used, "reclaimed once real time passed the end")
}

// A clock stepped back makes cleanup later, never earlier.
func TestBackStepNeverReclaimsEarly(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 1})
	traffic(t, b, clock, 2000, t0.Add(time.Hour), time.Second)
	exhaustAt := t0.Add(time.Hour) // windows until t0+2h
	for c := 0; c < 50; c++ {
		_, err := b.Take(ctx, fmt.Sprint("late", c), hourly, hourly.Limit, exhaustAt)
		require.NoError(t, err)
	}
	// Back to t0 for three hours of real time: a clock behind reclaims by
	// its own time.
	traffic(t, b, clock, 5000, t0, 2*time.Hour)
	traffic(t, b, clock, 5000, t0.Add(time.Minute), 3*time.Hour)
	for c := 0; c < 50; c++ {
		d, err := b.Peek(ctx, fmt.Sprint("late", c), hourly, exhaustAt.Add(time.Minute))
		require.NoError(t, err)
		require.Equal(t, hourly.Limit, d.Used, "late%d", c)
	}
}

// The boundary of Lag: a call whose now trails every other call's by less
// than Lag finds its state; by Lag or more, it may not.
func TestLagBoundary(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		ahead time.Duration // how far the other calls are past the window's end
		kept  bool
	}{
		{"others 1ms short of end+Lag", 999 * time.Millisecond, true},
		{"others at end+Lag", time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, clock := newWithClock(t, &memory.Options{Shards: 1, Lag: time.Second})
			traffic(t, b, clock, 2000, t0, 0) // the backend learns the clock
			p := throttler.Policy{Name: "s", Limit: 5, Window: time.Second}
			_, err := b.Take(ctx, "k", p, 2, t0) // ends at t0+1s
			require.NoError(t, err)
			at := t0.Add(time.Second + tc.ahead)
			traffic(t, b, clock, 3000, at, at.Sub(t0)) // two sweeps that saw only these
			d, err := b.Peek(ctx, "k", p, t0.Add(999*time.Millisecond))
			require.NoError(t, err)
			if tc.kept {
				assert.Equal(t, int64(2), d.Used)
			} else {
				assert.Zero(t, d.Used)
			}
		})
	}
}

// Case 7: two stores given the same calls for a key answer alike, whatever
// other keys' calls do. As in a shadow's candidate: the key's calls arrive
// late (their nows up to half a Lag behind the clock) and seldom, between
// many calls of other keys at the clock's time; in one run one of those is
// from a year ahead.
func TestStoresAgreeWhateverOtherKeysDo(t *testing.T) {
	ctx := context.Background()
	policies := []throttler.Policy{
		{Name: "fw", Limit: 3, Window: time.Second},
		{Name: "tb", Limit: 3, Window: time.Second, Algorithm: throttler.TokenBucket},
		{Name: "sl", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog},
		{Name: "sw", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingWindow},
	}
	for _, farFuture := range []bool{false, true} {
		t.Run(fmt.Sprint("far future call: ", farFuture), func(t *testing.T) {
			alone, clockA := newWithClock(t, &memory.Options{Shards: 1})
			busy, clockB := newWithClock(t, &memory.Options{Shards: 1})
			rng := rand.New(rand.NewPCG(7, 7))
			clock := t0
			receipts := map[string]time.Time{} // a policy's latest admitted Take's
			for i := 0; i < 400; i++ {
				clock = clock.Add(time.Duration(rng.IntN(80)) * time.Millisecond)
				clockA.set(clock.Sub(t0))
				clockB.set(clock.Sub(t0))
				for j := 0; j < 1500; j++ {
					at := clock
					if farFuture && i == 100 && j == 0 {
						at = clock.Add(365 * 24 * time.Hour)
					}
					_, err := busy.Take(ctx, fmt.Sprint("other", j%40), policies[j%4], 1, at)
					require.NoError(t, err)
				}
				now := clock.Add(-time.Duration(rng.IntN(500)) * time.Millisecond)
				p := policies[rng.IntN(4)]
				op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(4)]
				receipt, ok := receipts[p.Name]
				if !ok {
					receipt = now.Add(p.Window)
				}
				want, err := backend.Do(ctx, alone, op, "k", p, 1, receipt, now)
				require.NoError(t, err)
				if op == throttler.OpTake && want.Allowed {
					receipts[p.Name] = want.ResetAt
				}
				got, err := backend.Do(ctx, busy, op, "k", p, 1, receipt, now)
				require.NoError(t, err)
				require.Equal(t, want, got, "step %d: %v of k under %v at %v", i, op, p.Name, now.Sub(t0))
			}
		})
	}
}

// When the backend knows no clock yet (new, or idle for 2·ClockHold), the
// call that makes the first sweep may be the one from a year ahead: its now
// is trusted only as far as the shard's recent calls vouch for it. Here it
// is the seventh key of a new shard, whose table must grow, which sweeps.
func TestFarFutureNowMakesTheFirstSweep(t *testing.T) {
	b, _ := newWithClock(t, &memory.Options{Shards: 1})
	exhaust(t, b, 6)
	_, err := b.Take(context.Background(), "stray", hourly, 1, t0.Add(365*24*time.Hour))
	require.NoError(t, err)
	requireExhausted(t, b, 6, t0.Add(time.Second))
}

// Case 9: MaxKeys bounds the whole table, not each shard, and a full table
// keeps limiting every key it has seen: evicted or not, none gets a fresh
// window, and none is refused.
func TestMaxKeysBoundsTheWholeTable(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{MaxKeys: 1000}) // 256 shards
	p := throttler.Policy{Name: "p", Limit: 2, Window: time.Second}
	denied := 0
	for i := 0; i < 3000; i++ {
		d, err := b.Take(ctx, fmt.Sprint("k", i), p, 2, t0)
		require.NoError(t, err, "key %d of 3000", i)
		if !d.Allowed {
			denied++ // a new key whose fingerprint a shared cell holds
		}
		require.LessOrEqual(t, b.Len(), 1000)
	}
	t.Logf("%d new keys falsely denied", denied)
	assert.LessOrEqual(t, denied, 30, "new keys falsely denied, of 3000")
	for i := 0; i < 3000; i++ {
		d, err := b.Take(ctx, fmt.Sprint("k", i), p, 1, t0)
		require.NoError(t, err)
		require.False(t, d.Allowed, "k%d spent its 2", i)
		require.Equal(t, t0.Add(time.Second).UnixMilli(), d.ResetAt.UnixMilli(), "k%d", i)
	}
	assert.LessOrEqual(t, b.Len(), 1000)

	// Once the windows ended (and Lag), new keys find room: ended state
	// goes first, and the second tier's cells with it.
	clock.set(3 * time.Second)
	for i := 0; i < 1000; i++ {
		d, err := b.Take(ctx, fmt.Sprint("k", i), p, 1, t0.Add(3*time.Second))
		require.NoError(t, err, "key %d", i)
		require.True(t, d.Allowed, "k%d: a new window", i)
	}
}

// MaxKeys is exact under concurrency: 64 goroutines racing to add keys to
// a table of 1000 keep it at 1000, no call fails, and no key is admitted
// twice in its hour (a new key may be denied by a second-tier cell it
// happens to match: a false denial, never a unit over).
func TestMaxKeysConcurrent(t *testing.T) {
	b := newBackend(t, &memory.Options{MaxKeys: 1000})
	p := throttler.Policy{Name: "p", Limit: 1, Window: time.Hour}
	var over atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Go(func() {
			for i := 0; i < 50; i++ {
				k := fmt.Sprint(g, "-", i)
				if _, err := b.Take(context.Background(), k, p, 1, t0); err != nil {
					t.Error(k, err)
				}
				if memory.Keys(b) > 1000 {
					over.Add(1)
				}
			}
			for i := 0; i < 50; i++ {
				d, err := b.Take(context.Background(), fmt.Sprint(g, "-", i), p, 1, t0)
				if err != nil || d.Allowed {
					t.Error("admitted twice in its hour", err)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, over.Load())
	assert.Equal(t, 1000, b.Len())
}

// Case 9: Peek-only traffic drives reclaim too.
func TestPeekDrivesReclaim(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 4})
	p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second}
	for i := 0; i < 10_000; i++ {
		_, err := b.Take(ctx, fmt.Sprint("k", i), p, 1, t0)
		require.NoError(t, err)
	}
	require.Equal(t, 10_000, b.Len())
	clock.set(3 * time.Second)
	for i := 0; i < 40_000; i++ {
		_, err := b.Peek(ctx, fmt.Sprint("k", i%10_000), p, t0.Add(3*time.Second))
		require.NoError(t, err)
	}
	assert.Zero(t, b.Len(), "ended windows reclaimed by Peeks alone")
}

// Under a normal clock, state is reclaimed as it ends: a stream of new
// keys with windows of a second holds about (window + Lag + a sweep
// period) of them, not all it has seen.
func TestSteadyStateMemoryIsBounded(t *testing.T) {
	ctx := context.Background()
	b, clock := newWithClock(t, &memory.Options{Shards: 4})
	p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second}
	most := 0
	for ms := 0; ms < 60_000; ms++ { // a minute, a new key every ms
		clock.set(time.Duration(ms) * time.Millisecond)
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		_, err := b.Take(ctx, fmt.Sprint("k", ms), p, 1, now)
		require.NoError(t, err)
		_, err = b.Peek(ctx, fmt.Sprint("k", ms/2), p, now)
		require.NoError(t, err)
		most = max(most, b.Len())
	}
	assert.Less(t, most, 10_000, "at most the last few seconds' keys, of 60,000")
}

// ClockHold holds from a backend's first call: a client spends its hour, the
// clock jumps a day ahead while another key makes enough calls for sweeps,
// and comes back a second later. The client must find its hour spent, on
// every algorithm, with one shard and with the defaults (where the clients
// spread over shards with random seeds: many clients, many runs).
func TestClockHoldHoldsFromTheFirstCall(t *testing.T) {
	ctx := context.Background()
	algs := []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow}
	for _, alg := range algs {
		for _, tc := range []struct {
			name          string
			opts          *memory.Options
			clients, runs int
		}{
			{"one shard", &memory.Options{Shards: 1}, 1, 1},
			{"defaults", nil, 100, 10},
		} {
			t.Run(fmt.Sprintf("%v/%s", alg, tc.name), func(t *testing.T) {
				p := throttler.Policy{Name: "hourly", Limit: 10, Window: time.Hour, Algorithm: alg}
				admitted := 0
				for run := 0; run < tc.runs; run++ {
					b, clock := newWithClock(t, tc.opts)
					for c := 0; c < tc.clients; c++ {
						d, err := b.Take(ctx, fmt.Sprint("client", c), p, 10, t0)
						require.NoError(t, err)
						require.True(t, d.Allowed)
					}
					clock.set(time.Millisecond)
					for i := 0; i < 1100; i++ {
						_, err := b.Take(ctx, "other", p, 1, t0.Add(24*time.Hour))
						require.NoError(t, err)
					}
					clock.set(2 * time.Millisecond)
					for c := 0; c < tc.clients; c++ {
						d, err := b.Take(ctx, fmt.Sprint("client", c), p, 1, t0.Add(time.Second))
						require.NoError(t, err)
						if d.Allowed {
							admitted++
						}
					}
				}
				assert.Zero(t, admitted, "units admitted beyond spent hours")
			})
		}
	}
}

// The same after an idle spell longer than 2·ClockHold: the client's calls
// still vouch for the clock they showed, moved on by the real time passed,
// so its state answers as in a backend that saw no other key.
func TestClockHoldHoldsAfterIdle(t *testing.T) {
	ctx := context.Background()
	idle := 25 * time.Minute // ClockHold is 10m
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			p := throttler.Policy{Name: "hourly", Limit: 10, Window: time.Hour, Algorithm: alg}
			alone, clockA := newWithClock(t, &memory.Options{Shards: 1})
			busy, clockB := newWithClock(t, &memory.Options{Shards: 1})
			for _, b := range []*memory.Backend{alone, busy} {
				_, err := b.Take(ctx, "client", p, 10, t0)
				require.NoError(t, err)
			}
			clockA.set(idle)
			clockB.set(idle)
			for i := 0; i < 1100; i++ {
				_, err := busy.Take(ctx, "other", p, 1, t0.Add(idle+24*time.Hour))
				require.NoError(t, err)
			}
			at := t0.Add(idle + time.Second)
			want, err := alone.Take(ctx, "client", p, 1, at)
			require.NoError(t, err)
			got, err := busy.Take(ctx, "client", p, 1, at)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

// A clock that stands still keeps its state: a Throttler whose Clock is a
// fixed instant spends PerSecond(5); real time (as the backend reads it)
// moves on 3 s, with the sweeper's sweeps and, in one case, other keys'
// calls at the same instant; the same instant again is still denied, on
// every algorithm.
func TestStandingClockKeepsState(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		for _, others := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/other keys calling: %v", alg, others), func(t *testing.T) {
				b, clock := newWithClock(t, nil)
				th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return t0 }})
				require.NoError(t, err)
				p := throttler.PerSecond(5)
				p.Algorithm = alg
				for range 5 {
					d, err := th.Allow(ctx, "client", p)
					require.NoError(t, err)
					require.True(t, d.Allowed)
				}
				for ms := 100; ms <= 3000; ms += 100 {
					clock.set(time.Duration(ms) * time.Millisecond)
					if others {
						_, err := th.Allow(ctx, fmt.Sprint("other", ms), p)
						require.NoError(t, err)
					}
					memory.SweepAll(b)
				}
				d, err := th.Allow(ctx, "client", p)
				require.NoError(t, err)
				assert.False(t, d.Allowed, "admitted again at the same instant: %+v", d)
				assert.Equal(t, int64(5), d.Used)
			})
		}
	}
}

// A clock that runs at half real time's pace keeps what is live by it: its
// calls over 6 s of real time show the pace; 2.4 s of real time later (1.2
// s of its own), with no call, the sweeper has dropped nothing a call 700
// ms behind it (within Lag) still finds, on every algorithm: it answers as
// a twin that never swept.
func TestSlowClockKeepsState(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second, Algorithm: alg}
			swept, clock := newWithClock(t, nil)
			twin, twinClock := newWithClock(t, nil)
			var last time.Time
			for ms := 0; ms <= 6000; ms += 100 {
				clock.set(time.Duration(ms) * time.Millisecond)
				last = t0.Add(time.Duration(ms/2) * time.Millisecond)
				_, err := swept.Take(ctx, fmt.Sprint("other", ms), p, 1, last)
				require.NoError(t, err)
				memory.SweepAll(swept)
			}
			for _, b := range []*memory.Backend{swept, twin} {
				d, err := b.Take(ctx, "client", p, 5, last)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			clock.set(6000*time.Millisecond + 2400*time.Millisecond)
			twinClock.set(6000*time.Millisecond + 2400*time.Millisecond)
			memory.SweepAll(swept)
			at := last.Add(500 * time.Millisecond)
			want, err := twin.Peek(ctx, "client", p, at)
			require.NoError(t, err)
			got, err := swept.Peek(ctx, "client", p, at)
			require.NoError(t, err)
			assert.Equal(t, want, got)
			assert.NotZero(t, got.Used)
		})
	}
}

// A real clock still gets ended state reclaimed with no call: calls whose
// nows keep pace with real time (each trailing it by up to 300 ms) for 3
// s; then, with no call, the sweeper drops every state within 3 s of its
// end and Lag, and gives the tables' memory back, on every algorithm.
func TestRealClockReclaimedWithoutCalls(t *testing.T) {
	ctx := context.Background()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			p := throttler.Policy{Name: "p", Limit: 5, Window: time.Second, Algorithm: alg}
			b, clock := newWithClock(t, nil)
			rng := rand.New(rand.NewPCG(5, uint64(alg)))
			end := t0
			for ms := 0; ms <= 3000; ms += 10 {
				clock.set(time.Duration(ms) * time.Millisecond)
				now := t0.Add(time.Duration(ms-rng.IntN(300)) * time.Millisecond)
				d, err := b.Take(ctx, fmt.Sprint("k", ms), p, 1, now)
				require.NoError(t, err)
				last := d.ResetAt
				if alg == throttler.SlidingWindow {
					last = last.Add(p.Window) // a pair lasts a window more
				}
				if last.After(end) {
					end = last
				}
				if ms%1000 == 0 {
					memory.SweepAll(b)
				}
			}
			require.NotZero(t, b.Len())
			clock.set(end.Add(time.Second + 3*time.Second).Sub(t0)) // Lag, and 3 s
			memory.SweepAll(b)
			st := b.Stats()
			assert.Zero(t, st.Keys)
			assert.Zero(t, st.Bytes)
		})
	}
}

// BenchmarkSweepStandingClock is the sweeper's sweep of a backend holding
// 100,000 states under a clock that stands still: with no call since the
// last sweep, nothing can go, and the sweep touches no shard.
func BenchmarkSweepStandingClock(b *testing.B) {
	m, clock := newWithClock(b, nil)
	for i := range 100_000 {
		if _, err := m.Take(context.Background(), fmt.Sprint("k", i), hourly, 1, t0); err != nil {
			b.Fatal(err)
		}
	}
	ms := time.Duration(0)
	for b.Loop() {
		ms += time.Second
		clock.set(ms)
		memory.SweepAll(m)
	}
	if m.Len() != 100_000 {
		b.Fatal("a state live at the standing instant went")
	}
}

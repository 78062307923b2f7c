package throttler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// windowClock is a Throttler's Clock that a test moves.
type windowClock struct{ now time.Time }

func (c *windowClock) Now() time.Time                  { return c.now }
func (c *windowClock) Set(d time.Duration)             { c.now = t0.Add(d) }
func (c *windowClock) After(d time.Duration) time.Time { return t0.Add(d) }

// TestFallbackStint: once the fallback answers a key, it answers it, the
// primary back or not, until the state it counted has ended: a fixed
// window's or a sliding log's Window after the outage began, a
// sliding-window counter's two, a token bucket's refill from empty. Then
// the primary answers again, with none of its own units from before the
// outage left: no window of one store is answered by the other.
func TestFallbackStint(t *testing.T) {
	const failAt = 10 * time.Second // the outage begins, after one healthy Take at t0
	tests := []struct {
		name string
		p    throttler.Policy
		end  time.Duration // after failAt
	}{
		{"fixed window", throttler.PerMinute(10), time.Minute},
		{"named fixed window", throttler.PerMinute(10).Named("api"), time.Minute},
		{"sliding log", throttler.PerMinute(10).WithAlgorithm(throttler.SlidingLog), time.Minute},
		{"sliding window", throttler.PerMinute(10).WithAlgorithm(throttler.SlidingWindow), 2 * time.Minute},
		{"token bucket", throttler.PerMinute(10).WithBurst(20), 2 * time.Minute},
		{"token bucket, burst under the limit", throttler.PerMinute(60).WithBurst(3), 3 * time.Second},
		{"composite", throttler.All(throttler.PerSecond(2).Named("s"), throttler.PerMinute(10).Named("m")), time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock, mono := &windowClock{now: t0}, &monoClock{}
			primary := &stubBackend{next: newMemory(t)}
			var last throttler.Observation
			th := newThrottler(t, compositeStub{primary}, &throttler.Options{Clock: clock.Now, Fallback: newMemory(t),
				BreakerThreshold: 1, BreakerCooldown: time.Second, Observe: func(o throttler.Observation) { last = o }})
			throttler.SetMonotonic(th, mono.Now)

			d, err := th.Allow(ctx, "k", tc.p)
			require.NoError(t, err)
			require.False(t, d.Degraded)

			primary.set(errDown)
			clock.Set(failAt)
			d, err = th.Allow(ctx, "k", tc.p)
			require.NoError(t, err)
			require.True(t, d.Degraded, "the fallback answers the failed call")
			calls := primary.count()

			primary.set(nil)
			mono.Add(time.Hour) // the breaker's cooldown is long over
			for _, at := range []time.Duration{failAt + time.Millisecond, failAt + tc.end/2, failAt + tc.end - time.Millisecond} {
				clock.Set(at)
				for _, peek := range []bool{false, true} {
					if peek {
						d, err = th.Peek(ctx, "k", tc.p)
					} else {
						d, err = th.Allow(ctx, "k", tc.p)
					}
					require.NoError(t, err)
					assert.True(t, d.Degraded, "at %v (peek %v): still the fallback's", at, peek)
					assert.Equal(t, throttler.SourceFallback, last.Source)
					assert.NoError(t, last.Err, "no store was called, none failed")
				}
			}
			assert.Equal(t, calls, primary.count(), "the primary is not called while the fallback holds the key")

			clock.Set(failAt + tc.end)
			d, err = th.Allow(ctx, "k", tc.p)
			require.NoError(t, err)
			assert.False(t, d.Degraded, "the primary answers once the fallback's state has ended")
			assert.Equal(t, int64(1), d.Used, "none of the primary's units from before the outage are left")
			assert.Equal(t, calls+1, primary.count())
		})
	}
}

// TestFallbackStintPeekThenTake: a stint a Peek began reaches the end of the
// fixed window that a later Take opens in it, and no further.
func TestFallbackStintPeekThenTake(t *testing.T) {
	ctx := context.Background()
	clock := &windowClock{now: t0}
	primary := &stubBackend{next: newMemory(t), err: errDown}
	th := newThrottler(t, primary, &throttler.Options{Clock: clock.Now, Fallback: newMemory(t)})
	p := throttler.PerMinute(10)
	steps := []struct {
		at       time.Duration
		peek     bool
		degraded bool
		resetAt  time.Duration
	}{
		{0, true, true, time.Minute},                        // the stint begins
		{10 * time.Second, false, true, 70 * time.Second},   // the fallback's window opens
		{time.Minute, false, true, 70 * time.Second},        // still that window: the fallback's
		{69 * time.Second, true, true, 70 * time.Second},    // Peeks extend nothing
		{70 * time.Second, false, false, 130 * time.Second}, // the window ended: the primary's own
		{71 * time.Second, false, false, 130 * time.Second}, // and it stays so
	}
	for i, s := range steps {
		if i == 1 {
			primary.set(nil) // back as soon as the stint began
		}
		clock.Set(s.at)
		var d throttler.Decision
		var err error
		if s.peek {
			d, err = th.Peek(ctx, "k", p)
		} else {
			d, err = th.Allow(ctx, "k", p)
		}
		require.NoError(t, err)
		assert.Equal(t, s.degraded, d.Degraded, "step %d at %v", i, s.at)
		assert.True(t, clock.After(s.resetAt).Equal(d.ResetAt), "step %d at %v: ResetAt %v", i, s.at, d.ResetAt)
	}
}

// TestFallbackShare: with FallbackFleetSize n, the fallback admits each
// policy's Limit (and a bucket's Burst) ÷ n, rounded down, at least 1, and
// reports the policy's own Limit, the share's Remaining, Used = Limit -
// Remaining, Degraded, and SourceFallback to Observe.
func TestFallbackShare(t *testing.T) {
	tests := []struct {
		name  string
		fleet int
		p     throttler.Policy
		share int64
	}{
		{"default: a whole limit", 0, throttler.PerMinute(20), 20},
		{"fixed window", 4, throttler.PerMinute(20), 5},
		{"rounded down", 3, throttler.PerMinute(20), 6},
		{"never below 1", 4, throttler.PerMinute(3), 1},
		{"named", 4, throttler.PerMinute(20).Named("api"), 5},
		{"sliding log", 4, throttler.PerMinute(20).WithAlgorithm(throttler.SlidingLog), 5},
		{"sliding window", 4, throttler.PerMinute(20).WithAlgorithm(throttler.SlidingWindow), 5},
		{"token bucket", 4, throttler.PerSecond(20).WithAlgorithm(throttler.TokenBucket), 5},
		{"token bucket's burst", 4, throttler.PerSecond(10).WithBurst(40), 10},
		{"composite", 4, throttler.All(throttler.PerSecond(8).Named("s"), throttler.PerMinute(100).Named("m")), 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var obs []throttler.Observation
			th := newThrottler(t, compositeStub{&stubBackend{err: errDown}}, &throttler.Options{
				Clock: func() time.Time { return t0 }, Fallback: newMemory(t), FallbackFleetSize: tc.fleet,
				Observe: func(o throttler.Observation) { obs = append(obs, o) }})
			limit := tc.p.Capacity()
			admitted := int64(0)
			for i := int64(0); i < limit+1; i++ {
				d, err := th.Allow(context.Background(), "k", tc.p)
				require.NoError(t, err)
				require.True(t, d.Degraded)
				assert.Equal(t, limit, d.Limit, "the policy's own Limit")
				assert.Equal(t, d.Limit-d.Remaining, d.Used)
				if d.Allowed {
					admitted++
					assert.Equal(t, tc.share-admitted, d.Remaining, "what the share has left")
				} else {
					assert.Positive(t, d.RetryAfter)
				}
				for _, m := range d.Members() {
					assert.True(t, m.Degraded)
					assert.Equal(t, m.Limit-m.Remaining, m.Used)
				}
			}
			assert.Equal(t, tc.share, admitted)
			for _, o := range obs {
				assert.Equal(t, throttler.SourceFallback, o.Source)
			}
		})
	}
}

// TestFallbackShareEdges: a Take above the share is denied, never an error
// nor a failure mode; an unnamed policy's share keeps its own state beside
// an unnamed policy whose Limit is the share's.
func TestFallbackShareEdges(t *testing.T) {
	ctx := context.Background()
	th := newThrottler(t, &stubBackend{err: errDown}, &throttler.Options{Clock: func() time.Time { return t0 },
		Fallback: newMemory(t), FallbackFleetSize: 4})
	d, err := th.AllowN(ctx, "k", throttler.PerMinute(20), 6)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "6 is over the share of 5")
	assert.True(t, d.Degraded)
	assert.Equal(t, time.Minute, d.RetryAfter, "until the fallback's window ends")
	assert.Equal(t, int64(5), d.Remaining)

	d, err = th.AllowN(ctx, "k", throttler.PerMinute(100), 25)
	require.NoError(t, err)
	require.True(t, d.Allowed, "the whole share of 100 ÷ 4")
	d, err = th.Allow(ctx, "k", throttler.PerMinute(25))
	require.NoError(t, err)
	assert.True(t, d.Allowed, "PerMinute(25) is counted apart from PerMinute(100)'s share")
	assert.Equal(t, int64(5), d.Remaining, "its own share: 25 ÷ 4 = 6, one taken")
}

func TestFallbackFleetSizeOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    throttler.Options
	}{
		{"negative", throttler.Options{Fallback: newMemory(t), FallbackFleetSize: -1}},
		{"without a fallback", throttler.Options{FallbackFleetSize: 4}},
	} {
		_, err := throttler.New(newMemory(t), &tc.o)
		assert.ErrorContains(t, err, "FallbackFleetSize", tc.name)
	}
}

// inFlightBackend fails a Take of one unit, and holds a Take of more until
// release is closed, then answers it from next: a call in flight while
// another of its key fails.
type inFlightBackend struct {
	next             throttler.Backend
	started, release chan struct{}
}

func (b *inFlightBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if cost == 1 {
		return throttler.Decision{}, errDown
	}
	close(b.started)
	<-b.release
	return b.next.Take(ctx, key, p, cost, now)
}

func (b *inFlightBackend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return b.next.Peek(ctx, key, p, now)
}

func (b *inFlightBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return b.next.Refund(ctx, key, p, cost, receipt, now)
}

// TestFallbackStintCatchesCallsInFlight: a call the primary answers after
// another call of its key fell back is answered by the fallback too, so
// that the key's callers never see the primary's window again mid-stint.
func TestFallbackStintCatchesCallsInFlight(t *testing.T) {
	primary := &inFlightBackend{next: newMemory(t), started: make(chan struct{}), release: make(chan struct{})}
	th := newThrottler(t, primary, &throttler.Options{Clock: func() time.Time { return t0 }, Timeout: time.Minute,
		Fallback: newMemory(t)})
	p := throttler.PerMinute(10)
	type result struct {
		d   throttler.Decision
		err error
	}
	inFlight := make(chan result, 1)
	go func() {
		d, err := th.AllowN(context.Background(), "k", p, 2)
		inFlight <- result{d, err}
	}()
	<-primary.started
	d, err := th.Allow(context.Background(), "k", p)
	require.NoError(t, err)
	require.True(t, d.Degraded, "the failed call fell back")
	close(primary.release)
	r := <-inFlight
	require.NoError(t, r.err)
	assert.True(t, r.d.Degraded, "answered by the fallback, which holds the key")
	assert.Equal(t, int64(3), r.d.Used, "counted by the fallback after the first unit")
}

// TestFallbackStintsAreSwept: stints that ended are forgotten, those of
// keys that never call again included, so that after an outage the table
// empties and calls go back to one load.
func TestFallbackStintsAreSwept(t *testing.T) {
	ctx := context.Background()
	clock := &windowClock{now: t0}
	primary := &stubBackend{next: newMemory(t), err: errDown}
	th := newThrottler(t, primary, &throttler.Options{Clock: clock.Now, Fallback: newMemory(t)})
	for i := range 100 {
		_, err := th.Allow(ctx, fmt.Sprint("k", i), throttler.PerMinute(10))
		require.NoError(t, err)
	}
	_, err := th.Allow(ctx, "hour", throttler.PerHour(10))
	require.NoError(t, err)
	assert.Equal(t, int64(101), throttler.HeldStints(th))

	primary.set(nil)
	mono := &monoClock{}
	throttler.SetMonotonic(th, mono.Now)
	mono.Add(time.Hour) // the breaker's cooldown is over
	steps := []struct {
		at   time.Duration
		held int64
	}{
		{time.Minute - time.Millisecond, 101}, // every stint open
		{time.Minute, 101},                    // the minutes' ended, swept at most once a second
		{time.Minute + time.Second, 1},        // swept by another key's call
		{time.Hour, 0},
	}
	for _, s := range steps {
		clock.Set(s.at)
		_, err := th.Allow(ctx, "other", throttler.PerMinute(10))
		require.NoError(t, err)
		assert.Equal(t, s.held, throttler.HeldStints(th), "at %v", s.at)
	}
}

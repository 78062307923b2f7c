package throttler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestRefundBoundToWhatCountedTheUnits: a refund goes back only while what
// counted the units is current, for every algorithm, at fixed instants.
func TestRefundBoundToWhatCountedTheUnits(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		p    throttler.Policy
		// after is how long after the Take the refund comes; used is the
		// count a Peek at that instant shows after the refund.
		after    time.Duration
		refunded bool
		used     int64
	}{
		{"fixed window, open", throttler.PerSecond(3), 999 * ms, true, 1},
		{"fixed window, ended at its reset", throttler.PerSecond(3), time.Second, false, 0},
		{"sliding window, in its window", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingWindow), 999 * ms, true, 1},
		{"sliding window, in the next", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingWindow), time.Second, false, 2},
		{"token bucket, refilling", throttler.PerSecond(3).WithAlgorithm(throttler.TokenBucket), 300 * ms, true, 1},
		{"token bucket, full again", throttler.PerSecond(3).WithAlgorithm(throttler.TokenBucket), 667 * ms, false, 0},
		{"sliding log, entry live", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingLog), 999 * ms, true, 1},
		{"sliding log, entry ended", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingLog), time.Second, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The window-aligned start keeps the sliding window's epoch
			// windows where the table says: [t, t+1s).
			start := time.Unix(1_900_000_000, 0)
			clock := sleep.NewFake(start)
			th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
			ctx := context.Background()
			var taken throttler.Decision
			for range 2 {
				d, err := th.Allow(ctx, "k", tc.p)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				taken = d
			}
			clock.Add(tc.after)
			_, err := th.Refund(ctx, "k", tc.p, 1, taken)
			if tc.refunded {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, throttler.ErrNotRefunded)
			}
			d, err := th.Peek(ctx, "k", tc.p)
			require.NoError(t, err)
			assert.Equal(t, tc.used, d.Used, "Used after the refund")
		})
	}
}

// TestRefundFromAClockBehind: two processes share a store, one's clock
// 200 ms ahead of the other's. The one ahead sees the Take's window (or
// bucket state, or log entry) end first and counts a unit in what follows;
// a refund from the one behind, still before the Take's ResetAt on its own
// clock, must credit none of that: the store refunds only what the Take
// counted.
func TestRefundFromAClockBehind(t *testing.T) {
	const skew = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		p    throttler.Policy
		// used is what the process ahead then sees: its own unit, plus
		// what of the Take's 2 units still counts for it.
		used int64
	}{
		{"fixed window", throttler.PerSecond(3), 1},
		// Window K+1 at 100 ms: curr 1 + ceil(2·900/1000).
		{"sliding window", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingWindow), 3},
		// Refilled to full by 667 ms; the Take ahead leaves 2 of 3 tokens.
		{"token bucket", throttler.PerSecond(3).WithAlgorithm(throttler.TokenBucket), 1},
		// The Take ahead dropped the ended entry and logged its own.
		{"sliding log", throttler.PerSecond(3).WithAlgorithm(throttler.SlidingLog), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1_900_000_000, 0) // aligned to the counter's windows
			behind, ahead := sleep.NewFake(start), sleep.NewFake(start.Add(skew))
			store := newMemory(t)
			thBehind := newThrottler(t, store, &throttler.Options{Clock: behind.Now})
			thAhead := newThrottler(t, store, &throttler.Options{Clock: ahead.Now})
			ctx := context.Background()
			taken, err := thBehind.AllowN(ctx, "k", tc.p, 2)
			require.NoError(t, err)
			require.True(t, taken.Allowed)
			// 100 ms before the Take's ResetAt on the clock behind, 100 ms
			// after it on the clock ahead.
			step := taken.ResetAt.Sub(start) - skew/2
			behind.Add(step)
			ahead.Add(step)
			d, err := thAhead.Allow(ctx, "k", tc.p)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, tc.used, d.Used, "the process ahead counted in what follows the Take's")

			_, err = thBehind.Refund(ctx, "k", tc.p, 2, taken)
			require.NoError(t, err, "the clock behind has not reached the receipt: the store decides")
			d, err = thAhead.Peek(ctx, "k", tc.p)
			require.NoError(t, err)
			assert.Equal(t, tc.used, d.Used, "the refund credited what the Take never counted in")
		})
	}
}

// The case: 304s that finish after their window ended credited the
// next window, which then admitted 20 against a limit of 10.
func TestRefundNeverCreditsTheNextWindow(t *testing.T) {
	clock := sleep.NewFake(t0)
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	p, ctx := throttler.PerMinute(10), context.Background()
	var first []throttler.Decision
	for range 10 {
		d, err := th.Allow(ctx, "k", p)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		first = append(first, d)
	}
	clock.Add(time.Minute) // the window ended while the requests ran
	admitted := 0
	for i := range 10 {
		if d, err := th.Allow(ctx, "k", p); err == nil && d.Allowed {
			admitted++
		}
		_, err := th.Refund(ctx, "k", p, 1, first[i]) // each finishes with a 304
		assert.ErrorIs(t, err, throttler.ErrNotRefunded)
	}
	for range 10 {
		if d, err := th.Allow(ctx, "k", p); err == nil && d.Allowed {
			admitted++
		}
	}
	assert.Equal(t, 10, admitted, "admitted in the second window")
}

func TestRefundOfAnUncountedTake(t *testing.T) {
	clock := sleep.NewFake(t0)
	stub := &stubBackend{next: newMemory(t)}
	th := newThrottler(t, stub, &throttler.Options{Clock: clock.Now, BreakerThreshold: 100})
	p, ctx := throttler.PerMinute(1), context.Background()
	d, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	denied, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	stub.set(errDown)
	degraded, err := th.Allow(ctx, "k", p) // fails open
	require.NoError(t, err)
	require.True(t, degraded.Allowed && degraded.Degraded)
	stub.set(nil)
	calls := stub.count()
	for name, taken := range map[string]throttler.Decision{"denied": denied, "degraded": degraded, "zero": {}} {
		_, err := th.Refund(ctx, "k", p, 1, taken)
		assert.ErrorIs(t, err, throttler.ErrNotRefunded, name)
		assert.False(t, throttler.IsInputError(err), name)
	}
	assert.Equal(t, calls, stub.count(), "a refund of nothing reaches no store")
	_, err = th.Refund(ctx, "k", p, 1, d)
	require.NoError(t, err)
	after, err := th.Peek(ctx, "k", p)
	require.NoError(t, err)
	assert.Equal(t, int64(0), after.Used)
	// Bad input is reported as such, whatever the take was.
	_, err = th.Refund(ctx, "", p, 1, denied)
	assert.True(t, errors.Is(err, throttler.ErrInvalidKey), "%v", err)
}

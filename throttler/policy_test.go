package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestPolicyConstructors: what each constructor admits, call by call at
// fixed instants on one key: PerDay's window is 24 hours from the first
// request, Every admits one unit per interval and a denied caller waits for
// the rest of it, and Every with a burst is x/time/rate's limiter.
func TestPolicyConstructors(t *testing.T) {
	type call struct {
		at         time.Duration // after t0
		cost       int64
		allowed    bool
		retryAfter time.Duration
	}
	for _, tc := range []struct {
		name  string
		p     throttler.Policy
		calls []call
	}{
		{"PerDay", throttler.PerDay(2), []call{
			{0, 1, true, 0},
			{time.Hour, 1, true, 0},
			{24*time.Hour - time.Millisecond, 1, false, time.Millisecond},
			{24 * time.Hour, 2, true, 0},
		}},
		{"Every", throttler.Every(200 * time.Millisecond), []call{
			{0, 1, true, 0},
			{50 * time.Millisecond, 1, false, 150 * time.Millisecond},
			{199 * time.Millisecond, 1, false, time.Millisecond},
			{200 * time.Millisecond, 1, true, 0},
			// A quiet key saves up one unit, no more.
			{time.Second, 1, true, 0},
			{time.Second, 1, false, 200 * time.Millisecond},
		}},
		{"Every with a burst", throttler.Every(200 * time.Millisecond).WithBurst(3), []call{
			{0, 3, true, 0},
			{0, 1, false, 200 * time.Millisecond},
			{100 * time.Millisecond, 1, false, 100 * time.Millisecond},
			{400 * time.Millisecond, 2, true, 0},
			{400 * time.Millisecond, 1, false, 200 * time.Millisecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.p.Validate())
			store, err := memory.New(nil)
			require.NoError(t, err)
			now := t0
			th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
			require.NoError(t, err)
			for _, c := range tc.calls {
				now = t0.Add(c.at)
				d, err := th.AllowN(context.Background(), "k", tc.p, c.cost)
				require.NoError(t, err)
				assert.Equal(t, c.allowed, d.Allowed, "%d at %v", c.cost, c.at)
				assert.Equal(t, c.retryAfter, d.RetryAfter, "%d at %v", c.cost, c.at)
			}
		})
	}
}

// TestEveryRefusesAnIntervalNoStoreKeeps: Every's interval is a Window, so
// one that is not a whole number of milliseconds, at least one, is an
// invalid policy, never a limiter that admits everything.
func TestEveryRefusesAnIntervalNoStoreKeeps(t *testing.T) {
	for _, interval := range []time.Duration{0, -time.Second, time.Microsecond, 1500 * time.Microsecond} {
		assert.ErrorIs(t, throttler.Every(interval).Validate(), throttler.ErrInvalidPolicy, "%v", interval)
	}
	assert.Equal(t, "1 per 1s (token-bucket, burst 1)", throttler.Every(time.Second).String())
}

package throttler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// compositeTakeCounter is a waitTakeCounter that keeps its backend's
// Traits, so that it takes composites.
type compositeTakeCounter struct{ waitTakeCounter }

func (c *compositeTakeCounter) Traits() throttler.Traits { return throttler.TraitsOf(c.Backend) }

func newCompositeTakeCounter(t *testing.T) *compositeTakeCounter {
	return &compositeTakeCounter{waitTakeCounter{Backend: waitMemory(t)}}
}

// rolloutPolicies are policies whose enforcement a rollout sets: a single
// policy, and a composite whose members are both enforced by it.
func rolloutPolicies(t *testing.T) (*flags.Percent, []struct {
	name string
	p    throttler.Policy
}) {
	t.Helper()
	pct, err := flags.NewPercent(100)
	require.NoError(t, err)
	e, err := flags.Enforcement(pct)
	require.NoError(t, err)
	return pct, []struct {
		name string
		p    throttler.Policy
	}{
		{"policy", throttler.PerMinute(1).Named("api").EnforcedBy(e)},
		{"composite", throttler.All(
			throttler.PerMinute(1).Named("api").EnforcedBy(e),
			throttler.PerHour(10).Named("api-hour").EnforcedBy(e))},
	}
}

// TestWaitAfterARollbackToDryRunDoesNotQueue: a key enforced while a
// waiter sleeps until its reset, then rolled back to dry run: a new Wait
// of that key is answered at once, admitted with the would-be denial
// (WouldDeny, Used as counted), never queued behind the sleeping waiter,
// whether its deadline comes before the waiter's admission or it has none
// (0).
func TestWaitAfterARollbackToDryRunDoesNotQueue(t *testing.T) {
	for _, deadline := range []time.Duration{30 * time.Second, 0} {
		pct, policies := rolloutPolicies(t)
		for _, tc := range policies {
			t.Run(fmt.Sprintf("%s/deadline %v", tc.name, deadline), func(t *testing.T) {
				require.NoError(t, pct.Set(100))
				g := newWaitGated(t)
				th := waitThrottler(t, waitMemory(t), &throttler.Options{Clock: g.Now})
				_, err := th.Allow(context.Background(), "k", tc.p)
				require.NoError(t, err)
				_, stopHead := g.goHead(t, th, "k", tc.p, 1)
				require.Equal(t, 1, throttler.WaitLaneWaiters(th, "k", tc.p))

				require.NoError(t, pct.Set(0))
				ctx := context.Background()
				if deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, waitT0.Add(deadline))
					defer cancel()
				}
				r := receive(t, "the Wait of a key in dry run", goWait(ctx, th, "k", tc.p, 1, g.Now))
				require.NoError(t, r.err)
				assert.Equal(t, waitT0, r.at, "at once")
				assert.True(t, r.d.Allowed)
				assert.True(t, r.d.WouldDeny, "the would-be denial is reported")
				assert.Zero(t, r.d.RetryAfter)

				require.ErrorIs(t, stopHead().err, context.Canceled)
				assert.Zero(t, throttler.WaitLanes(th))
			})
		}
	}
}

// TestASleepingWaiterSeesARollback: a waiter asleep until its key's
// reset re-reads the key's enforcement every second; rolled back to dry
// run, it asks again at its next check and is admitted (WouldDeny), and
// the waiter queued behind it follows at once, a minute before the reset.
func TestASleepingWaiterSeesARollback(t *testing.T) {
	pct, policies := rolloutPolicies(t)
	for _, tc := range policies {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, pct.Set(100))
			g := newWaitGated(t)
			th := waitThrottler(t, waitMemory(t), &throttler.Options{Clock: g.Now})
			_, err := th.Allow(context.Background(), "k", tc.p)
			require.NoError(t, err)
			head := goWait(context.Background(), th, "k", tc.p, 1, g.Now)
			require.Equal(t, time.Second, receive(t, "the head's sleep", g.asleep), "a sleep between checks")
			queued := g.goQueued(t, th, "k", tc.p, 1, time.Hour)

			require.NoError(t, pct.Set(0))
			g.wake <- struct{}{}
			for _, r := range []waitResult{receive(t, "the head", head), receive(t, "the queued waiter", queued)} {
				require.NoError(t, r.err)
				assert.Equal(t, waitT0.Add(time.Second), r.at, "at the check after the rollback")
				assert.True(t, r.d.Allowed)
				assert.True(t, r.d.WouldDeny)
			}
			assert.Equal(t, []time.Duration{time.Second}, g.Sleeps())
			assert.Zero(t, throttler.WaitLanes(th))
		})
	}
}

// TestAnEnforcedWaiterChecksWithoutAsking: while its key stays enforced,
// a waiter's checks cost no store call: it sleeps the denial's RetryAfter
// in steps of a second and is admitted by its second Take, at the reset.
func TestAnEnforcedWaiterChecksWithoutAsking(t *testing.T) {
	pct, policies := rolloutPolicies(t)
	for _, tc := range policies {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, pct.Set(100))
			w := newWaitFakeWorld(t, nil)
			store := newCompositeTakeCounter(t)
			th := waitThrottler(t, store, &throttler.Options{Clock: w.Now})
			_, err := th.Allow(context.Background(), "k", tc.p)
			require.NoError(t, err)
			before := store.takes.Load()

			d, err := th.Wait(context.Background(), "k", tc.p)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.False(t, d.WouldDeny)
			assert.Equal(t, waitT0.Add(time.Minute), w.Now())
			sleeps := w.Sleeps()
			assert.Len(t, sleeps, 60)
			for _, s := range sleeps {
				assert.Equal(t, time.Second, s)
			}
			assert.Equal(t, int64(2), store.takes.Load()-before, "one denial, one admission")
		})
	}
}

package throttler

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/internal/sleep"
)

// SetWaitWorld makes th's Wait compare deadlines with now, sleep through
// sleep and draw its jitter from jitter (nil keeps the real one), so that
// tests run it at fixed instants: their sleep moves the fake clock that
// th's Options.Clock reads.
func SetWaitWorld(th *Throttler, now func() time.Time, sleep func(context.Context, time.Duration) error, jitter func(time.Duration) time.Duration) {
	if now != nil {
		th.wait.now = now
	}
	if sleep != nil {
		th.wait.sleep = sleep
	}
	if jitter != nil {
		th.wait.jitter = jitter
	}
}

// WaitJitterBound is the largest extra Wait adds to a sleep of d.
func WaitJitterBound(d time.Duration) time.Duration { return jitterBound(d) }

// WaitRandomJitter is the jitter Wait draws in production.
func WaitRandomJitter(bound time.Duration) time.Duration { return sleep.UpTo(bound) }

// WaitLaneWaiters is how many goroutines queue in the lane of key and p on
// t: 0 when there is no lane.
func WaitLaneWaiters(t *Throttler, key string, p Policy) int {
	t.lanes.mu.Lock()
	defer t.lanes.mu.Unlock()
	if l := t.lanes.m[laneKey{key: key, p: p}]; l != nil {
		return l.waiters
	}
	return 0
}

// WaitLanes is how many lanes t holds.
func WaitLanes(t *Throttler) int {
	t.lanes.mu.Lock()
	defer t.lanes.mu.Unlock()
	return len(t.lanes.m)
}

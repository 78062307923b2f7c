// Package sleep holds the two pieces of waiting that Throttler.Wait and the
// outbound transport share: a sleep a context interrupts, and the random
// part of a jitter.
package sleep

import (
	"context"
	"math/rand/v2"
	"time"
)

// Context sleeps for d, or until ctx is done, then returns ctx's error.
func Context(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// UpTo returns a random duration in [0, bound]; 0 for a bound <= 0.
func UpTo(bound time.Duration) time.Duration {
	if bound <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(bound) + 1))
}

package algo

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// WindowState builds the Decision for a fixed window that has counted used
// units and ends at resetAt, as seen at now, so that every backend derives
// Remaining and RetryAfter the same way. A zero resetAt, or one at or before
// now, means no window is open: used is taken as 0 and ResetAt as
// now + p.Window.
func WindowState(p throttler.Policy, used int64, resetAt, now time.Time, allowed bool) throttler.Decision {
	if !resetAt.After(now) { // a zero resetAt is long before any now
		used, resetAt = 0, now.Add(p.Window)
	}
	d := throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(p.Limit-used, 0), ResetAt: resetAt}
	if !allowed {
		d.RetryAfter = resetAt.Sub(now)
	}
	return d
}

// PeekState is the Decision that Peek and Refund return for a fixed window
// that has counted used units and ends at resetAt (zero when no window is
// stored): Allowed reports whether one more unit would be admitted.
func PeekState(p throttler.Policy, used int64, resetAt, now time.Time) throttler.Decision {
	d := WindowState(p, used, resetAt, now, true)
	if d.Remaining <= 0 {
		d.Allowed = false
		d.RetryAfter = d.ResetAt.Sub(now)
	}
	return d
}

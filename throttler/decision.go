package throttler

import "time"

// Decision is the state of one key's window after an operation, as the
// backend saw it in the same single call that decided.
type Decision struct {
	// Allowed reports, for Take, whether the cost was admitted and counted.
	// For Peek and Refund it reports whether one more unit would be admitted.
	Allowed bool
	// Limit is the policy's limit.
	Limit int64
	// Used is how many units the open window has counted.
	Used int64
	// Remaining is Limit - Used, never below zero (a lowered Limit can leave
	// Used above it).
	Remaining int64
	// ResetAt is when the window ends: identical for every call inside one
	// window. For a key with no open window it is now + Window, when a
	// window opened now would end. Zero only in a degraded decision made
	// without any backend, when the state is not known.
	ResetAt time.Time
	// RetryAfter is how long a denied caller should wait: ResetAt - now.
	// Zero when Allowed.
	RetryAfter time.Duration
	// Degraded reports that the primary backend did not make this decision:
	// the fallback did, or the Throttler's failure mode did (then ResetAt is
	// zero and Used and Remaining are not known).
	Degraded bool
}

// Known reports whether d carries a real count (false only for a degraded
// decision made without any backend).
func (d Decision) Known() bool { return !d.ResetAt.IsZero() }

// ResetUnix is ResetAt in Unix seconds, rounded up so that a client waiting
// until that second is never early: the value of X-RateLimit-Reset.
func (d Decision) ResetUnix() int64 {
	s := d.ResetAt.Unix()
	if d.ResetAt.Nanosecond() > 0 {
		s++
	}
	return s
}

// WindowState builds the Decision for a window that has counted used units
// and ends at resetAt, as seen at now. Backends call it so that every backend
// derives Remaining and RetryAfter the same way. A zero resetAt, or one at or
// before now, means no window is open: used is taken as 0 and ResetAt as
// now + p.Window.
func WindowState(p Policy, used int64, resetAt, now time.Time, allowed bool) Decision {
	if !resetAt.After(now) { // a zero resetAt is long before any now
		used, resetAt = 0, now.Add(p.Window)
	}
	d := Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(p.Limit-used, 0), ResetAt: resetAt}
	if !allowed {
		d.RetryAfter = resetAt.Sub(now)
	}
	return d
}

// PeekState is the Decision that Peek and Refund return for a window that
// has counted used units and ends at resetAt (zero when no window is
// stored): Allowed reports whether one more unit would be admitted.
func PeekState(p Policy, used int64, resetAt, now time.Time) Decision {
	d := WindowState(p, used, resetAt, now, true)
	if d.Remaining <= 0 {
		d.Allowed = false
		d.RetryAfter = d.ResetAt.Sub(now)
	}
	return d
}

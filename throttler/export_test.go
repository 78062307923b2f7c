package throttler

import "time"

// SetMonotonic replaces the monotonic clock that t's breaker cooldowns run
// on, so that tests move it without sleeping.
func SetMonotonic(t *Throttler, now func() time.Duration) { t.mono = now }

// Breakers is how many named stores t keeps a breaker for.
func Breakers(t *Throttler) int {
	if m := t.breakers.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// LeaseIDOf is l's ID: zero for a lease that no store holds.
func LeaseIDOf(l Lease) LeaseID { return l.id }

// HeldStints is how many stints t's table holds, ended ones not yet swept
// included.
func HeldStints(t *Throttler) int64 {
	if t.stints == nil {
		return 0
	}
	return t.stints.held.Load()
}

package memory

import "time"

// SetMonotonic makes b read the monotonic clock from f (the time since any
// fixed instant), so that tests move real time as they move the callers'
// now. Call it before b is used.
func SetMonotonic(b *Backend, f func() time.Duration) { b.mono = f }

// SweepAll runs the sweeper's sweep once, as its timer does.
func SweepAll(b *Backend) { b.sweepAll() }

// Keys is the count of states that MaxKeys bounds.
func Keys(b *Backend) int64 { return b.keys.Load() }

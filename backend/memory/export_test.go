package memory

import "time"

// SetMonotonic makes b read the monotonic clock from f (the time since any
// fixed instant), so that tests move real time as they move the callers'
// now. Call it before b is used.
func SetMonotonic(b *Backend, f func() time.Duration) { b.mono = f }

// FullSweeps is how many sweeps of every shard a full table has made.
func FullSweeps(b *Backend) int64 { return b.fullSweeps.Load() }

package memory

import (
	"hash/maphash"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// SetMonotonic makes b read the monotonic clock from f (the time since any
// fixed instant), so that tests move real time as they move the callers'
// now. Call it before b is used.
func SetMonotonic(b *Backend, f func() time.Duration) { b.mono = f }

// SweepAll runs the sweeper's sweep once, as its timer does.
func SweepAll(b *Backend) { b.sweepAll() }

// Keys is the count of states that MaxKeys bounds.
func Keys(b *Backend) int64 { return b.keys.Load() }

// TierCell is the second-tier cell that (key, p)'s state goes to when it is
// evicted from its shard.
func TierCell(b *Backend, key string, p throttler.Policy) int {
	hash, _ := tierKey(uint32(maphash.String(b.seed, key)), b.ids.number(ident(&p)))
	return home(uint32(hash), tierCells(b.quota))
}

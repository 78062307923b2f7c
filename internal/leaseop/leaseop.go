// Package leaseop runs a lease operation named as a value (throttler.OpAcquire
// or OpRelease), as backend.Do runs a rate one: for the wrappers that forward,
// replay or mirror lease calls (a shadow's mirror) and for tests' steps.
package leaseop

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// Do runs a lease operation on b: Acquire (held is then false) or Release.
// An op that is not throttler.OpAcquire or OpRelease is an error matching
// backend.ErrUnknownOp; nothing is called.
func Do(ctx context.Context, b throttler.LeaseBackend, op throttler.Op, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (held bool, d throttler.Decision, err error) {
	switch op {
	case throttler.OpAcquire:
		d, err = b.Acquire(ctx, key, p, id, now)
		return false, d, err
	case throttler.OpRelease:
		return b.Release(ctx, key, p, id, now)
	}
	return false, throttler.Decision{}, fmt.Errorf("%w: %v is not a lease operation", backend.ErrUnknownOp, op)
}

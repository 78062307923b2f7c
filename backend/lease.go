package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Leases: what authors of a throttler.LeaseBackend, and of wrappers that
// pass leases on (a router, a shadow), need beside throttler.ValidateLease.

// DoLease runs a lease operation on b, named as a value (a shadow's mirror,
// a test's steps): Acquire (held is then false) or Release. An op that is
// not throttler.OpAcquire or OpRelease is an error matching ErrUnknownOp;
// nothing is called.
func DoLease(ctx context.Context, b throttler.LeaseBackend, op throttler.Op, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (held bool, d throttler.Decision, err error) {
	switch op {
	case throttler.OpAcquire:
		d, err = b.Acquire(ctx, key, p, id, now)
		return false, d, err
	case throttler.OpRelease:
		return b.Release(ctx, key, p, id, now)
	}
	return false, throttler.Decision{}, fmt.Errorf("%w: %v is not a lease operation", ErrUnknownOp, op)
}

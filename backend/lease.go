package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Leases: what authors of a throttler.LeaseBackend, and of wrappers that
// pass leases on (a router, a shadow), need beside throttler.ValidateLease.

// LeaseStores is Stores for lease calls: implemented by a lease backend
// whose keys live on several stores, and by wrappers, which name the store
// of the backend the call will reach. A Throttler keeps a breaker per store
// for lease calls too; a backend without LeaseStores is one store for them
// (even if it has Stores, whose Store takes a rate Policy). Store's rules
// hold: no I/O, safe for concurrent use, a small fixed set of names, the
// same names as Store's for the same stores.
type LeaseStores interface {
	LeaseStore(key string, p throttler.ConcurrencyPolicy) string
}

// LeaseStoreOf returns the store of b that serves key's leases under p, or
// "" when b does not name its lease stores.
func LeaseStoreOf(b throttler.Backend, key string, p throttler.ConcurrencyPolicy) string {
	if s, ok := b.(LeaseStores); ok {
		return s.LeaseStore(key, p)
	}
	return ""
}

// LeaseHolder is implemented by wrappers that have a LeaseBackend's methods
// whatever they wrap, to say whether what they wrap holds leases: a router
// over a backend without leases must not claim them, so that a Throttler
// over it reports SupportsLeases false when it is built rather than failing
// every Acquire.
type LeaseHolder interface {
	HoldsLeases() bool
}

// Leases returns b as a LeaseBackend, and whether it holds leases: it has
// the methods and, if it is a LeaseHolder, says so. A Throttler decides the
// same way; wrapper constructors call it on what they wrap.
func Leases(b throttler.Backend) (throttler.LeaseBackend, bool) {
	lb, ok := b.(throttler.LeaseBackend)
	if !ok {
		return nil, false
	}
	if h, ok := b.(LeaseHolder); ok && !h.HoldsLeases() {
		return nil, false
	}
	return lb, true
}

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

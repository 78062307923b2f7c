// Package backend is for those who write a throttler.Backend or a wrapper
// around one (a router, a shadow); applications use package throttler and
// never need this one.
//
// A backend author starts from the contract on throttler.Backend (and
// throttler.LeaseBackend for concurrency limits), declares what a Throttler
// needs to know of the store in throttler.Traits, and runs the conformance
// suite, backend/backendtest (Run, RunLeases), from the backend's tests.
// docs/algorithms.md states the exact arithmetic each algorithm computes, to
// the millisecond. A backend's operation starts with throttler.ValidateCall
// (a lease: ValidateLease) and answers bad input with its error before
// touching any store; a store's failure is marked
// with throttler.StoreFailure or KeyFailure. That is the only validation a
// call gets: wrappers forward without validating, since the backend they
// end in validates, and the Throttler validates only when its backend
// fails.
//
// This package holds what such code shares: an operation named as a value
// (OpFunc, Do, ErrUnknownOp), and the batching counts a backend that batches
// round trips reports (BatchStats).
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// ErrUnknownOp is returned by Do for an Op that names no operation.
var ErrUnknownOp = errors.New("backend: unknown operation")

// Do runs op on b: Take of cost, Peek (cost unused), or Refund of cost
// with its receipt (the ResetAt of the Take that counted the units; unused
// by Take and Peek, which callers pass as the zero time). Code that
// forwards, replays or tabulates calls (a shadow's mirror, a test's steps)
// names the operation as a value and calls Do. An op that names no
// operation is an error matching ErrUnknownOp; nothing is called.
func Do(ctx context.Context, b throttler.Backend, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	switch op {
	case throttler.OpTake:
		return b.Take(ctx, key, p, cost, now)
	case throttler.OpPeek:
		return b.Peek(ctx, key, p, now)
	case throttler.OpRefund:
		return b.Refund(ctx, key, p, cost, receipt, now)
	}
	return throttler.Decision{}, fmt.Errorf("%w: %v", ErrUnknownOp, op)
}

// OpFunc is a throttler.Backend written as one function of the operation,
// as http.HandlerFunc is a Handler: its Take, Peek and Refund call it with
// their Op (and cost 1 for Peek; the zero receipt for Take and Peek).
// Wrappers that treat the three alike embed one instead of writing each
// method, and hand receipt on with the call (see Do).
type OpFunc func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error)

var _ throttler.Backend = OpFunc(nil)

// Take calls f with throttler.OpTake.
func (f OpFunc) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return f(ctx, throttler.OpTake, key, p, cost, time.Time{}, now)
}

// Peek calls f with throttler.OpPeek and cost 1.
func (f OpFunc) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return f(ctx, throttler.OpPeek, key, p, 1, time.Time{}, now)
}

// Refund calls f with throttler.OpRefund.
func (f OpFunc) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return f(ctx, throttler.OpRefund, key, p, cost, receipt, now)
}

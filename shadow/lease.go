package shadow

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Leases through a shadow: the control serves Acquire and Release, and each is mirrored to the
// candidate as a Take is (the same queue, so the calls of one key reach it in order), with the same
// LeaseID, so that the candidate holds the leases the control holds: every Acquire the control
// answered and every Release are mirrored, and a lease the candidate granted where the control did
// not (it denied, or failed) is released on the candidate at once, since no Release will come for
// it.
//
// A shadow holds leases when its control does; the calls are mirrored when the candidate holds
// leases too (throttler.Traits), and otherwise served by the control alone.

var _ throttler.LeaseBackend = (*Backend)(nil)

// leaseCall is what a lease operation adds to a mirrored call.
type leaseCall struct {
	p    throttler.ConcurrencyPolicy
	id   throttler.LeaseID
	held bool // the control's answer to a Release
}

// Acquire returns the control's answer and mirrors the call, unless the control rejected it as bad
// input. The shadow does not validate: the control does.
func (b *Backend) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if b.controlLeases == nil {
		return throttler.Decision{}, b.noLeases()
	}
	d, err := b.controlLeases.Acquire(ctx, key, p, id, now)
	if b.candidateLeases == nil || err != nil && throttler.IsInputError(err) {
		return d, err
	}
	b.mirror(throttler.OpAcquire, key, throttler.Policy{}, 0, time.Time{}, now, 0, &d, err, &leaseCall{p: p, id: id})
	return d, err
}

// Release returns the control's answer and mirrors the call, unless the control rejected it as bad
// input.
func (b *Backend) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if b.controlLeases == nil {
		return false, throttler.Decision{}, b.noLeases()
	}
	held, d, err := b.controlLeases.Release(ctx, key, p, id, now)
	if b.candidateLeases == nil || err != nil && throttler.IsInputError(err) {
		return held, d, err
	}
	b.mirror(throttler.OpRelease, key, throttler.Policy{}, 0, time.Time{}, now, 0, &d, err, &leaseCall{p: p, id: id, held: held})
	return held, d, err
}

func (b *Backend) noLeases() error {
	return fmt.Errorf("%w: the shadow's control (%T)", throttler.ErrLeasesUnsupported, b.control)
}

// undoAcquire releases on the candidate the lease of c, which the candidate granted and the control
// did not: nobody will release it, and held until its TTL it would make the candidate stricter than
// the control. A failure is left alone: the lease then expires at its TTL.
func (b *Backend) undoAcquire(w *worker, c *call) {
	if w.jobs == nil {
		_, _, _ = b.invoke(w.callContext(b.ctx, b.opts.Timeout), c, true)
		return
	}
	if w.stuck && !b.awaitRunner(w) {
		w.skip = true
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.Timeout)
	defer cancel()
	if _, _, _, abandoned := w.hand(ctx, c, true); abandoned {
		w.skip = true
	}
}

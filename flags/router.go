package flags

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// ErrNoBackend is returned when a key maps to a nil backend.
var ErrNoBackend = errors.New("flags: no backend")

// RouterOptions configure a Router. The zero value (or nil) means defaults.
type RouterOptions struct {
	// OldName names the old backend in errors. default: "old"
	OldName string
	// NewName names the new backend in errors. default: "new"
	NewName string
}

func (o *RouterOptions) withDefaults() RouterOptions {
	var r RouterOptions
	if o != nil {
		r = *o
	}
	if r.OldName == "" {
		r.OldName = "old"
	}
	if r.NewName == "" {
		r.NewName = "new"
	}
	return r
}

// Router is a throttler.Backend that sends each call to the old or the new
// backend, as its Rollout says for the key at call time. While the rollout's
// setting holds still, a key stays on one backend, so its budget never
// splits across two stores. It is safe for concurrent use.
type Router struct {
	old, new         throttler.Backend
	rollout          Rollout
	oldName, newName string
	// The counters sit on separate cache lines: every call bumps one.
	oldCalls atomic.Uint64
	_        [56]byte
	newCalls atomic.Uint64
	_        [56]byte
}

var (
	_ throttler.Backend   = (*Router)(nil)
	_ throttler.InProcess = (*Router)(nil)
)

// InProcess reports whether the calls of both backends never block.
func (r *Router) InProcess() bool {
	return r.old != nil && r.new != nil && throttler.IsInProcess(r.old) && throttler.IsInProcess(r.new)
}

// NewRouter returns a Router over old and new. A nil r routes every key to
// old. nil opts mean defaults.
func NewRouter(old, new throttler.Backend, r Rollout, opts *RouterOptions) *Router {
	o := opts.withDefaults()
	return &Router{old: old, new: new, rollout: r, oldName: o.OldName, newName: o.NewName}
}

// Stats counts the calls a Router has sent to each backend.
type Stats struct {
	Old, New uint64
}

// Stats returns how many calls have gone to each backend so far. Calls
// rejected for bad input reach neither and are not counted.
func (r *Router) Stats() Stats {
	return Stats{Old: r.oldCalls.Load(), New: r.newCalls.Load()}
}

// UseNew reports whether key would be sent to the new backend now.
func (r *Router) UseNew(key string) bool {
	return r.rollout != nil && r.rollout.UseNew(key)
}

// pick returns the backend for key, and whether it is the new one, and
// counts the call.
func (r *Router) pick(key string) (throttler.Backend, bool) {
	if r.rollout != nil && r.rollout.UseNew(key) {
		r.newCalls.Add(1)
		return r.new, true
	}
	r.oldCalls.Add(1)
	return r.old, false
}

// Take takes cost units for key from the backend the key maps to now.
func (r *Router) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	b, isNew := r.pick(key)
	if b == nil {
		return throttler.Decision{}, r.errNil(isNew, key)
	}
	d, err := b.Take(ctx, key, p, cost, now)
	if err != nil {
		return d, r.wrap(err, isNew)
	}
	return d, nil
}

// Peek reads key's window from the backend the key maps to now.
func (r *Router) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, 1); err != nil {
		return throttler.Decision{}, err
	}
	b, isNew := r.pick(key)
	if b == nil {
		return throttler.Decision{}, r.errNil(isNew, key)
	}
	d, err := b.Peek(ctx, key, p, now)
	if err != nil {
		return d, r.wrap(err, isNew)
	}
	return d, nil
}

// Refund gives cost units back to key's window on the backend the key maps
// to now. A refund after the key has moved goes to the backend that serves
// it now, as the next Take would.
func (r *Router) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	b, isNew := r.pick(key)
	if b == nil {
		return throttler.Decision{}, r.errNil(isNew, key)
	}
	d, err := b.Refund(ctx, key, p, cost, now)
	if err != nil {
		return d, r.wrap(err, isNew)
	}
	return d, nil
}

func (r *Router) name(isNew bool) string {
	if isNew {
		return r.newName
	}
	return r.oldName
}

// errNil and wrap stay out of line: the error paths' frames would otherwise
// weigh on every call.
//
//go:noinline
func (r *Router) errNil(isNew bool, key string) error {
	return fmt.Errorf("%w: %s backend is nil (key %q)", ErrNoBackend, r.name(isNew), key)
}

// wrap names the backend that failed; errors.Is still finds the cause.
//
//go:noinline
func (r *Router) wrap(err error, isNew bool) error {
	return fmt.Errorf("flags: %s backend: %w", r.name(isNew), err)
}

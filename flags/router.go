package flags

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/throttler"
)

// RouterOptions configure a Router. The zero value (or nil) means defaults.
type RouterOptions struct {
	// OldName names the old backend in errors. default: "old"
	OldName string
	// NewName names the new backend in errors. default: "new"
	NewName string
	// MaxLeases bounds how many held leases the router remembers the
	// granting backend of, so that a Release reaches it even after the
	// rollout moved the key (see Router.Release). A lease granted while the
	// table is full, or forgotten since, is released to both backends.
	// default: 65536
	MaxLeases int
}

// defaultMaxLeases holds the leases of a busy process (each entry is about
// a hundred bytes, and the key).
const defaultMaxLeases = 1 << 16

func (o *RouterOptions) withDefaults() (RouterOptions, error) {
	var r RouterOptions
	if o != nil {
		r = *o
	}
	if r.MaxLeases < 0 {
		return r, fmt.Errorf("flags: RouterOptions.MaxLeases is %d; want 0 (default %d) or more", r.MaxLeases, defaultMaxLeases)
	}
	if r.OldName == "" {
		r.OldName = "old"
	}
	if r.NewName == "" {
		r.NewName = "new"
	}
	if r.MaxLeases == 0 {
		r.MaxLeases = defaultMaxLeases
	}
	return r, nil
}

// opFunc is backend.OpFunc under a name that is not exported, so that
// embedding it gives Router its Take, Peek and Refund without a field
// anyone outside could reassign.
type opFunc = backend.OpFunc

// Router is a throttler.Backend whose Take, Peek and Refund send each call
// to the old or the new backend, as its Rollout says for the key at call
// time (or its Strategy, see NewRouterWith). While the rollout's setting
// holds still, a key stays on one backend, so its budget never splits
// across two stores. A Refund after the key has moved goes to the backend
// that serves it now, as the next Take would, with the receipt of the Take
// the other one counted: a fixed window there is never the receipt's, so
// nothing is refunded; the other algorithms match a receipt by instants,
// not by store, so that store may take back up to the units refunded from
// its own state of the Take's window (see throttler.Backend). It is safe
// for concurrent use.
type Router struct {
	opFunc           // r.do(): Take, Peek and Refund
	old, new         throttler.Backend
	rollout          Rollout
	strategy         Strategy // nil: the rollout routes every call
	oldName, newName string
	// The counters sit on cache lines of their own, apart from the fields
	// every call reads: every call bumps one.
	_        [64]byte
	oldCalls atomic.Uint64
	_        [56]byte
	newCalls atomic.Uint64
	_        [56]byte

	leases routerLeases // leases.go

	oldTraits, newTraits throttler.Traits
}

var _ throttler.Backend = (*Router)(nil)

// NewRouter returns a Router over oldB and newB, ramped by r. Both backends
// and r are required: to keep every key on oldB, pass NewPercent(0). nil
// opts mean defaults.
func NewRouter(oldB, newB throttler.Backend, r Rollout, opts *RouterOptions) (*Router, error) {
	return NewRouterWith(oldB, newB, r, nil, opts)
}

// Strategy routes each call of a Router in place of its Rollout, for a
// router that serves some keys from both backends at once: package
// migration's keys moving between stores. Route and RouteLease run on
// every call: they must be cheap, safe for concurrent use, and agree with
// the rollout, which still answers UseNew and Store.
type Strategy interface {
	// Route returns whether the call for key under p is the new backend's
	// and, for a key to be served by both backends, the backend that makes
	// the call on both (nil otherwise). The Router calls that one instead,
	// counting the call as the serving backend's and naming that one in
	// errors.
	Route(key string, p throttler.Policy) (toNew bool, both throttler.Backend)
	// RouteLease is Route for a lease call: an Acquire goes to both when
	// moving is true, and the Release of a lease the Router does not
	// remember goes to both whenever it is not nil, since the strategy
	// knows where copies of such a lease may be held.
	RouteLease(key string, p throttler.ConcurrencyPolicy) (toNew, moving bool, both throttler.LeaseBackend)
}

// NewRouterWith is NewRouter with s routing each call instead of r; nil s
// is NewRouter.
func NewRouterWith(oldB, newB throttler.Backend, r Rollout, s Strategy, opts *RouterOptions) (*Router, error) {
	if err := nilness.Check("flags: old backend", oldB); err != nil {
		return nil, err
	}
	if err := nilness.Check("flags: new backend", newB); err != nil {
		return nil, err
	}
	if err := requiredRollout("flags: rollout", r); err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	rt := &Router{old: oldB, new: newB, rollout: r, oldName: o.OldName, newName: o.NewName}
	if s != nil {
		if err := nilness.Check("flags: strategy", s); err != nil {
			return nil, err
		}
		rt.strategy = s
	}
	rt.opFunc = rt.do()
	rt.oldTraits, rt.newTraits = throttler.TraitsOf(oldB), throttler.TraitsOf(newB)
	rt.initLeases(o.MaxLeases)
	return rt, nil
}

// requiredRollout is nilness.Check for a Rollout: a nil one, or a nil
// pointer in one, would panic on the first call.
func requiredRollout(what string, r Rollout) error {
	if r == nil {
		return fmt.Errorf("%s is nil; pass flags.NewPercent(0) to keep every key on old", what)
	}
	return nilness.Check(what, r)
}

// Traits are what both backends' say together: in process when both are,
// ignoring their context when either does (so that a Throttler detaches the
// calls), holding leases and taking composites when both do (a composite
// goes as it is to the backend its key is routed to); each call's store is
// the one the
// backend the key is routed to names, or, for a backend that names none,
// that backend (RouterOptions.OldName or NewName), so that a Throttler keeps
// the two backends' breakers apart.
func (r *Router) Traits() throttler.Traits {
	return throttler.Traits{
		InProcess:      r.oldTraits.InProcess && r.newTraits.InProcess,
		IgnoresContext: r.oldTraits.IgnoresContext || r.newTraits.IgnoresContext,
		Leases:         r.leases.old != nil,
		Composites:     r.oldTraits.Composites && r.newTraits.Composites,
		Store:          r.store,
		LeaseStore:     r.leaseStore,
	}
}

// store names the store op for key under p reaches now (see Traits).
func (r *Router) store(op throttler.Op, key string, p throttler.Policy) string {
	t, name := r.routed(key)
	if s := t.Store(op, key, p); s != "" {
		return s
	}
	return name
}

// leaseStore names the store a lease call for key under p reaches now, as
// store does for rate calls.
func (r *Router) leaseStore(key string, p throttler.ConcurrencyPolicy) string {
	t, name := r.routed(key)
	if s := t.LeaseStore(key, p); s != "" {
		return s
	}
	return name
}

// routed returns the Traits of the backend key is routed to now, and its
// name.
func (r *Router) routed(key string) (*throttler.Traits, string) {
	if r.rollout.UseNew(key) {
		return &r.newTraits, r.newName
	}
	return &r.oldTraits, r.oldName
}

// Stats counts the calls a Router has sent to each backend.
type Stats struct {
	// Old and New count every call, lease calls included.
	Old, New uint64
	// Leases counts the lease calls among them.
	Leases LeaseStats
}

// Stats returns how many calls have gone to each backend so far, including
// those the backend rejected as bad input.
func (r *Router) Stats() Stats {
	return Stats{Old: r.oldCalls.Load(), New: r.newCalls.Load(), Leases: r.leaseStats()}
}

// UseNew reports whether key would be sent to the new backend now.
func (r *Router) UseNew(key string) bool { return r.rollout.UseNew(key) }

// do returns the function behind Take, Peek and Refund: it sends the call
// to the backend key maps to now (or to the strategy's backend for both),
// and counts it. The router does not validate: the backend it ends in
// does. It is a closure over r rather than the method value r.do, and it
// switches on op itself rather than calling backend.Do: either would cost
// every call one more frame (about 10 ns, a quarter of what the router
// adds).
func (r *Router) do() backend.OpFunc {
	return func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		var isNew bool
		var b throttler.Backend
		if r.strategy == nil {
			isNew = r.rollout.UseNew(key)
		} else {
			isNew, b = r.strategy.Route(key, p)
		}
		if isNew {
			r.newCalls.Add(1)
			if b == nil {
				b = r.new
			}
		} else {
			r.oldCalls.Add(1)
			if b == nil {
				b = r.old
			}
		}
		var d throttler.Decision
		var err error
		switch op {
		case throttler.OpTake:
			d, err = b.Take(ctx, key, p, cost, now)
		case throttler.OpPeek:
			d, err = b.Peek(ctx, key, p, now)
		case throttler.OpRefund:
			d, err = b.Refund(ctx, key, p, cost, receipt, now)
		default:
			return backend.Do(ctx, b, op, key, p, cost, receipt, now) // ErrUnknownOp
		}
		if err != nil {
			return d, r.wrap(err, isNew)
		}
		return d, nil
	}
}

// wrap names the backend that failed; errors.Is still finds the cause. An
// input error is the caller's, whichever backend found it, and is returned
// as it is. It stays out of line: the error path's frame would otherwise
// weigh on every call.
//
//go:noinline
func (r *Router) wrap(err error, isNew bool) error {
	if throttler.IsInputError(err) {
		return err
	}
	name := r.oldName
	if isNew {
		name = r.newName
	}
	return fmt.Errorf("%s backend: %w", name, err)
}

// Percenter is a Rollout that routes by a percentage of Bucket(GroupID(),
// key), as Percent and File do: a key is new when its bucket is at most
// Percent(). Knowing the percentage, a caller can tell where a key was
// routed under an earlier setting; package migration uses it to find the
// keys a change moves. GroupID must not change.
type Percenter interface {
	Rollout
	// Percent returns the current percentage, 0 to 100.
	Percent() int
	// GroupID returns the bucketing group.
	GroupID() string
}

var _ Percenter = (*Percent)(nil)

// AsPercenter returns r as a Percenter: a *File's settings, or r itself when
// it is one (an unleash.PercentSource is). ok is false for a rollout that
// cannot tell its percentage (an unleash.Source, or a rollout of your own
// without the two methods).
func AsPercenter(r Rollout) (p Percenter, ok bool) {
	if f, isFile := r.(*File); isFile && f != nil {
		return filePercent{f.pct}, true
	}
	p, ok = r.(Percenter)
	return p, ok
}

// filePercent is a File's Percent seen through Percenter, without its Set.
type filePercent struct{ p *Percent }

func (f filePercent) UseNew(key string) bool { return f.p.UseNew(key) }
func (f filePercent) Percent() int           { return f.p.Percent() }
func (f filePercent) GroupID() string        { return f.p.GroupID() }

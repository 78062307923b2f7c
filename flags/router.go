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
// time. While the rollout's setting
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
	strategy         strategy // nil: the rollout routes every call
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
	// sides are where a rate call goes: old, new, then both backends with
	// old serving and with new serving (the strategy's; nil b without one).
	sides [4]side
}

var _ throttler.Backend = (*Router)(nil)

// NewRouter returns a Router over oldB and newB, ramped by r. Both backends
// and r are required: to keep every key on oldB, pass NewPercent(0). nil
// opts mean defaults.
func NewRouter(oldB, newB throttler.Backend, r Rollout, opts *RouterOptions) (*Router, error) {
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
	// Package migration's rollout routes each call itself, sending a key
	// that is moving between stores to both.
	rt.strategy, _ = r.(strategy)
	rt.opFunc = rt.do()
	rt.oldTraits, rt.newTraits = throttler.TraitsOf(oldB), throttler.TraitsOf(newB)
	rt.sides = [4]side{
		{r: rt, b: oldB, traits: &rt.oldTraits, name: rt.oldName},
		{r: rt, b: newB, traits: &rt.newTraits, name: rt.newName, isNew: true},
		{r: rt, traits: &rt.oldTraits, name: rt.oldName},
		{r: rt, traits: &rt.newTraits, name: rt.newName, isNew: true},
	}
	if rt.strategy != nil {
		rt.sides[2].b, rt.sides[3].b = rt.strategy.Both(false), rt.strategy.Both(true)
	}
	rt.initLeases(o.MaxLeases)
	return rt, nil
}

// strategy routes each call of a Router in place of its rollout, for a
// router that serves some keys from both backends at once: package
// migration's keys moving between stores. A rollout that is also a
// strategy (a migration's is: the caller's rollout wrapped) makes NewRouter
// route by it; package migration's tests fail if its rollout stops being
// one. Route and RouteLease run on every call: they must be cheap, safe
// for concurrent use, and agree with the rollout's UseNew.
type strategy interface {
	// Route returns whether the call for key under p is the new backend's
	// and whether it goes to both backends: then the Router calls
	// Both(toNew) instead, counting the call as the serving backend's and
	// naming that one in errors and as its store.
	Route(key string, p throttler.Policy) (toNew, both bool)
	// Both returns the backend that makes a call on both backends, the new
	// one serving when toNew. The Router asks once, when it is built.
	Both(toNew bool) throttler.Backend
	// RouteLease is Route for a lease call: an Acquire goes to both when
	// moving is true, and the Release of a lease the Router does not
	// remember goes to both whenever it is not nil, since the strategy
	// knows where copies of such a lease may be held.
	RouteLease(key string, p throttler.ConcurrencyPolicy) (toNew, moving bool, both throttler.LeaseBackend)
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
// the two backends' breakers apart. Their Route names a rate call's store
// and sends the call from one reading of the rollout, so that a Throttler
// never charges one backend's breaker with a call the other made.
func (r *Router) Traits() throttler.Traits {
	return throttler.Traits{
		InProcess:      r.oldTraits.InProcess && r.newTraits.InProcess,
		IgnoresContext: r.oldTraits.IgnoresContext || r.newTraits.IgnoresContext,
		Leases:         r.leases.old != nil,
		Composites:     r.oldTraits.Composites && r.newTraits.Composites,
		Store:          r.store,
		LeaseStore:     r.leaseStore,
		Route:          r.route,
	}
}

// route names the store a rate call for key under p goes to and returns
// the side that sends it there, from one reading of the rollout (see
// throttler.Traits.Route); for a Throttler that holds another backend than
// r (a wrapper of r), it only names the store.
func (r *Router) route(b throttler.Backend, op throttler.Op, key string, p throttler.Policy) (string, throttler.Backend) {
	if b != throttler.Backend(r) {
		return r.store(op, key, p), nil
	}
	s := r.pick(key, p)
	if name := s.traits.Store(op, key, p); name != "" {
		return name, s
	}
	return s.name, s
}

// pick returns where a rate call for key under p goes now: the one reading
// of the rollout (or the strategy) a call makes.
func (r *Router) pick(key string, p throttler.Policy) *side {
	var toNew, both bool
	if r.strategy == nil {
		toNew = r.rollout.UseNew(key)
	} else {
		toNew, both = r.strategy.Route(key, p)
	}
	return &r.sides[b2i(toNew)+2*b2i(both)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// side is one way a Router sends rate calls: to one backend, or to both
// (the strategy's), counted as the serving backend's calls and named so in
// errors. A Throttler that asked the Router's Traits.Route calls it in the
// Router's place.
type side struct {
	r      *Router
	b      throttler.Backend
	traits *throttler.Traits // the serving backend's, for the store's name
	name   string            // the serving backend's
	isNew  bool
}

func (s *side) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.r.count(s.isNew)
	d, err := s.b.Take(ctx, key, p, cost, now)
	if err != nil {
		return d, s.r.wrap(err, s.isNew)
	}
	return d, nil
}

func (s *side) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	s.r.count(s.isNew)
	d, err := s.b.Peek(ctx, key, p, now)
	if err != nil {
		return d, s.r.wrap(err, s.isNew)
	}
	return d, nil
}

func (s *side) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	s.r.count(s.isNew)
	d, err := s.b.Refund(ctx, key, p, cost, receipt, now)
	if err != nil {
		return d, s.r.wrap(err, s.isNew)
	}
	return d, nil
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
// store does for rate calls. Unlike a rate call's (Route), an Acquire's
// store is named from a reading of the rollout of its own: the Acquire
// reads it again (or finds the lease in its table), so a change in between
// can charge the other backend's breaker with that one call.
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
	Leases struct {
		// Acquires and releases sent to each backend.
		OldAcquires, NewAcquires, OldReleases, NewReleases uint64
		// Unknown counts the Releases of leases the router did not
		// remember, each sent to both backends (see Router.Release).
		Unknown uint64
		// Untracked counts the leases granted while the table was full
		// (RouterOptions.MaxLeases): their Release goes to both backends.
		// Healthy: 0.
		Untracked uint64
		// Held is how many leases the router remembers now.
		Held int
	}
}

// Stats returns how many calls have gone to each backend so far, including
// those the backend rejected as bad input.
func (r *Router) Stats() Stats {
	s := Stats{Old: r.oldCalls.Load(), New: r.newCalls.Load()}
	r.leaseStats(&s)
	return s
}

// do returns the function behind Take, Peek and Refund: it sends the call
// to the backend key maps to now (or to the strategy's backend for both),
// and counts it, as a side does, written out. The router does not validate: the backend it ends in
// does. It is a closure over r rather than the method value r.do, and it
// switches on op itself rather than calling backend.Do: either would cost
// every call one more frame (about 10 ns, a quarter of what the router
// adds).
func (r *Router) do() backend.OpFunc {
	return func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		// pick, written out: a call of it would cost a frame.
		var toNew, both bool
		if r.strategy == nil {
			toNew = r.rollout.UseNew(key)
		} else {
			toNew, both = r.strategy.Route(key, p)
		}
		s := &r.sides[b2i(toNew)+2*b2i(both)]
		isNew, b := s.isNew, s.b
		r.count(isNew)
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

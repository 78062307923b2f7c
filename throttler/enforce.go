package throttler

import (
	"context"
	"fmt"
	"reflect"
)

// Enforcer says which keys a policy is enforced for (Policy.Enforce); the
// others run it in dry run. Enforced must be cheap, safe for concurrent use
// and stable: for a given setting, the same key always gets the same
// answer. Package flags turns its rollouts (a static percentage, a file,
// Unleash) into one with flags.Enforcement.
//
// An Enforcer is part of a Policy, which is compared and used as a map key,
// so it must be comparable: a pointer, or a value with no map, slice or
// function in it. Policy.Validate refuses any other.
type Enforcer interface {
	Enforced(key string) bool
}

// dryRun enforces no key: Policy.DryRun.
type dryRun struct{}

func (dryRun) Enforced(string) bool { return false }

// DryRun returns a copy of p enforced for no key: every call is counted
// exactly as under p and answered admitted, and a call p would have denied
// says so in Decision.WouldDeny.
func (p Policy) DryRun() Policy {
	p.Enforce = dryRun{}
	return p
}

// validateEnforcer reports why e cannot be a Policy's Enforce, or nil. It
// runs on every call of a policy with an Enforce: DryRun's and a pointer
// (flags.Enforcement's) are told apart without reflect.Value.Comparable,
// which allocates for a struct.
func validateEnforcer(e Enforcer) error {
	if _, ok := e.(dryRun); ok {
		return nil
	}
	v := reflect.ValueOf(e)
	switch v.Kind() {
	case reflect.Pointer, reflect.Chan:
		if v.IsNil() {
			return fmt.Errorf("%w: Enforce is a nil %T", ErrInvalidPolicy, e)
		}
		return nil
	case reflect.Map, reflect.Slice, reflect.Func:
		if v.IsNil() {
			return fmt.Errorf("%w: Enforce is a nil %T", ErrInvalidPolicy, e)
		}
	}
	if !v.Comparable() {
		return fmt.Errorf("%w: Enforce is a %T, which is not comparable (use a pointer to it)", ErrInvalidPolicy, e)
	}
	return nil
}

// doEnforced is doAt for a policy with an Enforce e. The backend counts the
// policy without it: its identity and count are the same whoever is
// enforced, and raising enforcement never hands a key a fresh window. A
// denial of a key that e does not enforce is answered admitted, WouldDeny
// set, no RetryAfter; e is asked only on a denial (an admission is the same
// either way). A failure mode's denial (Options.FailClosed) is one too: a
// key in dry run is never refused; its Observation still carries the
// failure. An Enforce that cannot be used is an error, observed as bad
// input is.
//
// Apart from doAt and out of line, so that a policy without Enforce pays one
// comparison: the same check inside doAt cost every call about 5 ns.
//
//go:noinline
func (t *Throttler) doEnforced(ctx context.Context, r *request) (Decision, error) {
	e := r.p.Enforce
	if err := validateEnforcer(e); err != nil {
		if t.opts.Observe != nil {
			var store string
			if t.store != nil {
				store = t.store(r.op, r.key, r.p)
			}
			t.observe(r, store, Decision{}, SourceNone, err)
		}
		return Decision{}, err
	}
	if r.p.all != nil && !t.composites {
		return t.refuseComposite(r)
	}
	r.p.Enforce = nil
	var store string // named, and the call routed, as doAt does
	if t.route != nil {
		store, r.to = t.route(t.backend, r.op, r.key, r.p)
	} else if t.store != nil {
		store = t.store(r.op, r.key, r.p)
	}
	d, src, primaryErr, err := t.decide(ctx, r, store, SourcePrimary)
	d.At = r.now
	if !d.Allowed && src != SourceNone && !e.Enforced(r.key) {
		d.Allowed, d.WouldDeny, d.RetryAfter = true, true, 0
		err = nil
	}
	r.p.Enforce = e // the policy as the caller gave it, for Observe
	if t.opts.Observe != nil {
		if primaryErr == nil {
			primaryErr = err
		}
		t.observe(r, store, d, src, primaryErr)
	}
	return d, err
}

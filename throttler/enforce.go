package throttler

import (
	"context"
	"fmt"

	"github.com/throttlekit/throttlekit/internal/nilness"
)

// Enforcer says which keys a policy is enforced for (Policy.EnforcedBy);
// for the others the policy runs in dry run. Enforced must be cheap, safe
// for concurrent use and stable: for a given setting, the same key always
// gets the same answer. Package flags turns its rollouts (a static
// percentage, a file, Unleash) into one with flags.Enforcement.
type Enforcer interface {
	Enforced(key string) bool
}

// enforcement is what a Policy holds of its Enforcer: a pointer, so that the
// Policy stays comparable whatever the Enforcer is, and grows by one word
// (a Policy is copied on every call; 16 bytes more cost every call about
// 5 ns, 8 bytes nothing measurable).
type enforcement struct{ e Enforcer }

// dryRun enforces no key: Policy.DryRun.
type dryRun struct{}

func (dryRun) Enforced(string) bool { return false }

// dryRunAll is DryRun's enforcement, shared, so that p.DryRun() == p.DryRun().
var dryRunAll = &enforcement{dryRun{}}

// DryRun returns a copy of p enforced for no key: every call is counted
// exactly as under p and answered admitted, and a call p would have denied
// says so in Decision.WouldDeny.
func (p Policy) DryRun() Policy {
	p.enforce = dryRunAll
	return p
}

// EnforcedBy returns a copy of p enforced only for the keys e enforces; the
// others run p in dry run: counted exactly as enforced, answered admitted,
// a would-be denial reported in Decision.WouldDeny. Which keys are enforced
// is not part of the identity in storage, so a key keeps its window when
// its enforcement changes. On a composite (All) it applies to the whole;
// its members may not have one. A nil e (or a nil pointer in it) makes p
// invalid: Validate says so. Two policies compare equal only when they
// hold the enforcement of the same call of EnforcedBy (or DryRun): build
// one when the program is configured, not per call.
func (p Policy) EnforcedBy(e Enforcer) Policy {
	p.enforce = &enforcement{e}
	return p
}

// Enforcer returns what p's enforcement was set by (EnforcedBy, DryRun), or
// nil when p is enforced for every key.
func (p Policy) Enforcer() Enforcer {
	if p.enforce == nil {
		return nil
	}
	return p.enforce.e
}

// validateEnforcement reports why p's enforcement cannot be used, or nil.
func (p Policy) validateEnforcement() error {
	if p.enforce == nil {
		return nil
	}
	if err := nilness.Check("the Enforcer of EnforcedBy", p.enforce.e); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	return nil
}

// doEnforced is doAt for a policy with an enforcement e (EnforcedBy, DryRun). The backend counts the
// policy without it: its identity and count are the same whoever is
// enforced, and raising enforcement never hands a key a fresh window. A
// denial of a key that e does not enforce is answered admitted, WouldDeny
// set, no RetryAfter; e is asked only on a denial (an admission is the same
// either way). A failure mode's denial (Options.FailClosed) is one too: a
// key in dry run is never refused; its Observation still carries the
// failure. An Enforcer that cannot be used (nil) is an error, observed as
// bad input is.
//
// Apart from doAt and out of line, so that a policy without one pays one
// comparison: the same check inside doAt cost every call about 5 ns.
//
//go:noinline
func (t *Throttler) doEnforced(ctx context.Context, r *request) (Decision, error) {
	e := r.p.enforce
	if err := r.p.validateEnforcement(); err != nil {
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
	r.p.enforce = nil
	var store string // named, and the call routed, as doAt does
	if t.route != nil {
		store, r.to = t.route(t.backend, r.op, r.key, r.p)
	} else if t.store != nil {
		store = t.store(r.op, r.key, r.p)
	}
	d, src, primaryErr, err := t.decide(ctx, r, store, SourcePrimary)
	d.At = r.now
	if !d.Allowed && src != SourceNone && !e.e.Enforced(r.key) {
		d.Allowed, d.WouldDeny, d.RetryAfter = true, true, 0
		err = nil
	}
	r.p.enforce = e // the policy as the caller gave it, for Observe
	if t.opts.Observe != nil {
		if primaryErr == nil {
			primaryErr = err
		}
		t.observe(r, store, d, src, primaryErr)
	}
	return d, err
}

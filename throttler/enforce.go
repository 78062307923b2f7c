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

// byMember is the enforcement of a composite whose members have their own:
// the whole is never asked (see doByMember).
type byMember struct{}

func (byMember) Enforced(string) bool { return true }

// memberEnforcement is byMember's, set by All, so that such a composite
// takes the enforced path at no cost to any other call.
var memberEnforcement = &enforcement{byMember{}}

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
// nil when p is enforced for every key, or is a composite whose members
// have their own.
func (p Policy) Enforcer() Enforcer {
	if p.enforce == nil || p.enforce == memberEnforcement {
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
		return t.refuse(r, err)
	}
	if r.p.all != nil && !t.composites {
		return t.refuseComposite(r)
	}
	if e == memberEnforcement {
		return t.doByMember(ctx, r)
	}
	r.p.enforce = nil
	store := t.storeOf(r)
	d, src, primaryErr, err := t.decide(ctx, r, store, SourcePrimary)
	d.At = r.now
	if !d.Allowed && src != SourceNone && !e.e.Enforced(r.key) {
		d.admitAsWouldDeny()
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

// refuse answers r with err, bad input found before any store call,
// observed as such.
func (t *Throttler) refuse(r *request, err error) (Decision, error) {
	if t.opts.Observe != nil {
		var store string
		if t.store != nil {
			store = t.store(r.op, r.key, r.p)
		}
		t.observe(r, store, Decision{}, SourceNone, err)
	}
	return Decision{}, err
}

// doByMember is doEnforced for a composite whose members have their own
// enforcement. A member not enforced for the key counts exactly as it
// would, and never stops the others: when only such members deny, the
// composite is taken again without them, all or nothing over the rest,
// until an enforced member denies or the rest admit (at most MaxMembers
// calls, the extra ones only on a would-be denial). Each member's Decision
// is as it would be alone (a would-be denial says Allowed and WouldDeny);
// the composite's Allowed, Remaining and binding member are the enforced
// members' (see combine), and it says WouldDeny when any member would
// have denied. A failure mode's answer has no members: it is a denial
// only when some member is enforced for the key.
func (t *Throttler) doByMember(ctx context.Context, r *request) (Decision, error) {
	caller, c := r.p, r.p.all
	n := len(c.members)
	var dry uint8
	for i, m := range c.members {
		if m.enforce == nil {
			continue
		}
		if err := m.validateEnforcement(); err != nil {
			return t.refuse(r, fmt.Errorf("member %d: %w", i, err))
		}
		if !m.enforce.e.Enforced(r.key) {
			dry |= 1 << i
		}
	}
	var ms [MaxMembers]Decision
	var active [MaxMembers]int // the members of this call, by index
	for i := range n {
		active[i] = i
	}
	left := n
	r.p = Policy{all: c.bare}
	var store string
	var d Decision
	var src Source
	var primaryErr, err error
	for {
		store = t.storeOf(r)
		d, src, primaryErr, err = t.decide(ctx, r, store, SourcePrimary)
		if src == SourceNone || src == SourceFailureMode {
			break // an error, or a failure mode's answer, which has no members
		}
		if left == 1 {
			ms[active[0]] = d
		} else {
			for j, md := range d.Members() {
				ms[active[j]] = md
			}
		}
		if d.Allowed || r.op != OpTake {
			break
		}
		kept, enforcedDenies := 0, false
		for _, i := range active[:left] {
			if ms[i].Allowed {
				active[kept], kept = i, kept+1
			} else if dry&(1<<i) == 0 {
				enforcedDenies = true // so does the composite
				break
			}
		}
		if enforcedDenies || kept == 0 || kept == left {
			break
		}
		left = kept
		r.p = c.bare.subset(active[:left])
	}
	if src == SourceNone || src == SourceFailureMode {
		if !d.Allowed && src != SourceNone && dry == 1<<n-1 {
			d.admitAsWouldDeny()
			err = nil
		}
	} else {
		for i := range n {
			if dry&(1<<i) != 0 && !ms[i].Allowed {
				ms[i].admitAsWouldDeny()
			}
		}
		d = combine(ms[:n], dry) // Degraded if the last call's members are
	}
	d.At = r.now
	r.p = caller
	if t.opts.Observe != nil {
		if primaryErr == nil {
			primaryErr = err
		}
		t.observe(r, store, d, src, primaryErr)
	}
	return d, err
}

// admitAsWouldDeny makes d, a denial of a key its policy does not enforce,
// the admission that answers it: Allowed, WouldDeny, no RetryAfter.
func (d *Decision) admitAsWouldDeny() {
	d.Allowed, d.WouldDeny, d.RetryAfter = true, true, 0
}

// storeOf names the store r goes to (Traits.Store), and when the backend
// routes (Traits.Route) sets r.to to what makes the call, from one reading.
func (t *Throttler) storeOf(r *request) string {
	if t.route != nil {
		var store string
		store, r.to = t.route(t.backend, r.op, r.key, r.p)
		return store
	}
	if t.store != nil {
		return t.store(r.op, r.key, r.p)
	}
	return ""
}

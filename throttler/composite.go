package throttler

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"
	"time"
)

// MaxMembers is the most policies a composite holds (see All): enough for a
// per-second, a per-minute, a per-hour and a per-day limit on one key, and
// few enough that a store checks them all in one atomic call.
const MaxMembers = 4

// composite is what a composite Policy carries: its members, copied when it
// is built and never changed, so that every copy of the Policy (a value)
// shares them safely and two copies compare equal.
type composite struct {
	members []Policy
	// capacity is the composite's Capacity: the least of its members', the
	// most one Take can ever be admitted.
	capacity int64
	// bare is nil unless a member has its own enforcement (EnforcedBy,
	// DryRun): then it is the same members without, what a backend is
	// given, since enforcement is not part of a member's storage identity.
	bare *composite
}

// All returns a composite of the given policies on one key: a Policy that a
// Throttler's Allow, AllowN, Wait, WaitN and Peek, and the HTTP middleware,
// accept wherever they accept one policy, and whose Take is all or nothing.
// Two or more policies make a composite; All of one policy is that policy.
//
// A composite needs a backend whose Traits say Composites (backend/memory
// does); a Throttler over another answers it with an error matching
// ErrInvalidPolicy. Validate checks it: 2 to MaxMembers members, each valid
// and no composite itself, of distinct storage identities (no two members
// count the same state), and none of the composite's own fields set (its
// members carry the limits: All(a, b).Named("x") is invalid).
//
// The rules, which every backend keeps, are in Backend's doc and
// docs/algorithms.md ("Composites"); in short, a Take of cost is admitted
// only if every member admits it, and then counts it in every member, else
// it counts nothing anywhere. Each member's windows are those it has taken
// alone: a composite only groups policies, it forks no state.
//
// A member may run in dry run, or be enforced for a share of keys, by its
// own DryRun or EnforcedBy (the composite then may have neither): see
// "Dry run and enforcement" in docs/operations.md and Decision.Members.
//
// Composites compare equal only when built by the same call of All (or
// copied from one): build one when the program is configured, not per call.
func All(members ...Policy) Policy {
	if len(members) == 1 {
		return members[0]
	}
	c := newComposite(members)
	if !slices.ContainsFunc(members, func(m Policy) bool { return m.enforce != nil }) {
		return Policy{all: c}
	}
	c.bare = newComposite(members)
	for i := range c.bare.members {
		c.bare.members[i].enforce = nil
	}
	return Policy{all: c, enforce: memberEnforcement}
}

// newComposite is the composite of a copy of members, its capacity the
// least of theirs.
func newComposite(members []Policy) *composite {
	c := &composite{members: append([]Policy(nil), members...)}
	for i, m := range c.members {
		if n := m.Capacity(); i == 0 || n < c.capacity {
			c.capacity = n
		}
	}
	return c
}

// Composite reports whether p is a composite of several policies (see All).
func (p Policy) Composite() bool { return p.all != nil }

// Members yields a composite's members, with their index, in the order All
// was given them; nothing for a single policy.
func (p Policy) Members() iter.Seq2[int, Policy] {
	return func(yield func(int, Policy) bool) {
		if p.all == nil {
			return
		}
		for i, m := range p.all.members {
			if !yield(i, m) {
				return
			}
		}
	}
}

// validateComposite is Validate for a composite.
func (p Policy) validateComposite() error {
	m := p.all.members
	switch {
	case p.Name != "" || p.Limit != 0 || p.Window != 0 || p.Algorithm != FixedWindow || p.Burst != 0:
		return fmt.Errorf("%w: a composite's own fields must be zero: its members carry the limits", ErrInvalidPolicy)
	case len(m) == 0:
		return fmt.Errorf("%w: a composite of no policies", ErrInvalidPolicy)
	case len(m) > MaxMembers:
		return fmt.Errorf("%w: a composite holds at most %d policies, got %d", ErrInvalidPolicy, MaxMembers, len(m))
	case p.all.bare != nil && p.enforce != memberEnforcement:
		return fmt.Errorf("%w: a composite whose members have their own enforcement (EnforcedBy, DryRun) "+
			"may not have one of its own", ErrInvalidPolicy)
	}
	for i, a := range m {
		if a.all != nil {
			return fmt.Errorf("%w: member %d is a composite: list its members instead", ErrInvalidPolicy, i)
		}
		if err := a.Validate(); err != nil {
			return fmt.Errorf("member %d: %w", i, err)
		}
		for j, b := range m[:i] {
			if sameIdentity(a, b) {
				return fmt.Errorf("%w: members %d (%v) and %d (%v) count the same state: name them apart",
					ErrInvalidPolicy, j, b, i, a)
			}
		}
	}
	return nil
}

// sameIdentity reports whether a and b have one storage identity (see
// Policy): (Name, Algorithm) when named, the whole definition when not.
func sameIdentity(a, b Policy) bool {
	if a.Algorithm != b.Algorithm || a.Name != b.Name {
		return false
	}
	return a.Name != "" || a.Limit == b.Limit && a.Window == b.Window && a.Burst == b.Burst
}

// String is a composite's Policy.String: "all(a: 1 per 1s; b: 100 per
// 1h0m0s)".
func (c *composite) String() string {
	parts := make([]string, len(c.members))
	for i, m := range c.members {
		parts[i] = m.String()
	}
	return "all(" + strings.Join(parts, "; ") + ")"
}

// memberDecisions are a composite Decision's members' own, behind a
// pointer so that a Decision stays comparable (two composite Decisions are
// == only when one is a copy of the other) and small: 128 bytes, one
// allocation per composite call, without pointers, so that the collector
// never scans them.
type memberDecisions [MaxMembers]memberDecision

// memberDecision is a member's Decision in four words: its Limit with
// Allowed, Degraded, WouldDeny and whether the member is in dry run for the
// call's key in bits above any Limit, Used, ResetAt in Unix ns (zeroTime for
// the zero time) and RetryAfter. Its Remaining is Limit - Used, never below
// zero, as every Decision's is.
type memberDecision struct {
	limit, used, resetAt int64
	retry                time.Duration
}

const (
	allowedBit   = 1 << 62
	degradedBit  = 1 << 61
	wouldDenyBit = 1 << 60
	// dryBit marks a member not enforced for the call's key: it binds
	// nothing while another member is (see combine).
	dryBit    = 1 << 59
	limitMask = dryBit - 1
	// zeroTime stands for the zero ResetAt, which Unix ns cannot hold.
	zeroTime = math.MinInt64
)

func compact(d *Decision, dry bool) memberDecision {
	m := memberDecision{limit: d.Limit & limitMask, used: d.Used, resetAt: zeroTime, retry: d.RetryAfter}
	if d.Allowed {
		m.limit |= allowedBit
	}
	if d.Degraded {
		m.limit |= degradedBit
	}
	if d.WouldDeny {
		m.limit |= wouldDenyBit
	}
	if dry {
		m.limit |= dryBit
	}
	if !d.ResetAt.IsZero() {
		m.resetAt = d.ResetAt.UnixNano()
	}
	return m
}

func (m *memberDecision) decision() Decision {
	limit := m.limit & limitMask
	d := Decision{Allowed: m.limit&allowedBit != 0, Limit: limit, Used: m.used, Remaining: max(limit-m.used, 0),
		RetryAfter: m.retry, Degraded: m.limit&degradedBit != 0, WouldDeny: m.limit&wouldDenyBit != 0}
	if m.resetAt != zeroTime {
		d.ResetAt = time.Unix(0, m.resetAt)
	}
	return d
}

// Combine returns the Decision of a composite from its members' own
// Decisions, in the composite's order (at most MaxMembers; more is the zero
// Decision), by the rules of Backend's doc: a backend that takes composites
// builds each member's Decision and calls it. No member is the zero
// Decision.
func Combine(members []Decision) Decision { return combine(members, 0) }

// combine is Combine for a call in which the members in the bit set dry
// are not enforced for the key (their own EnforcedBy or DryRun): they bind
// nothing, so that Remaining, Limit and the reset are the enforced members'
// (the headers a client sees), unless no member is enforced. An admitted
// composite says WouldDeny when any member does.
func combine(members []Decision, dry uint8) Decision {
	if len(members) > MaxMembers {
		return Decision{}
	}
	if dry == 1<<len(members)-1 {
		dry = 0 // none enforced: every member binds, as in a dry-run composite
	}
	b := binding(members, dry)
	if b < 0 {
		return Decision{}
	}
	d := members[b]
	d.members = new(memberDecisions)
	for i := range members {
		m := &members[i]
		isDry := dry&(1<<i) != 0
		*d.memberAt(i) = compact(m, isDry)
		d.Allowed = d.Allowed && m.Allowed
		if !isDry {
			d.Remaining = min(d.Remaining, m.Remaining)
		}
		d.Degraded = d.Degraded || m.Degraded
		d.WouldDeny = d.WouldDeny || m.WouldDeny
	}
	d.nMembers = uint8(len(members))
	if d.Allowed {
		d.RetryAfter = 0
	} else {
		d.WouldDeny = false // the composite is denied: an enforced member denies
	}
	return d
}

// Members yields, for a composite policy's Decision (see All), each
// member's own Decision with its index, in the composite's order (its
// ResetAt in the local time zone, its At the composite's); nothing for a
// single policy's. In a denied composite nothing was counted: a member that
// would have admitted the cost says Allowed, with its state as it stands (as
// a Peek's), and a denying one says what its own denied Take says. A member
// in dry run for the key that would have denied says Allowed and WouldDeny,
// as it would alone: it counted nothing, the enforced members counted the
// cost, and the composite says WouldDeny.
func (d Decision) Members() iter.Seq2[int, Decision] {
	return func(yield func(int, Decision) bool) {
		for i := range int(d.nMembers) {
			m := d.memberAt(i).decision()
			m.At = d.At
			if !yield(i, m) {
				return
			}
		}
	}
}

// member is the i-th member's Decision of a composite's (the zero Decision
// when d has no such member).
func (d Decision) member(i int) Decision {
	if i >= int(d.nMembers) {
		return Decision{}
	}
	m := d.memberAt(i).decision()
	m.At = d.At
	return m
}

// memberAt is where member i's Decision is kept, i < nMembers (or, in
// Combine, the room for it).
func (d *Decision) memberAt(i int) *memberDecision { return &d.members[i] }

// memberCount is how many members' Decisions d holds.
func (d Decision) memberCount() int { return int(d.nMembers) }

// Binding returns the index of the member that binds a composite's
// Decision, whose Limit, Used, ResetAt and RetryAfter it reports, or -1 for
// a single policy's Decision. When every member admits it is the one with
// the least Remaining; when any denies, the denying one with the longest
// RetryAfter. Ties go to the latest ResetAt (a client told to come back
// then finds every tied member ready), then to the first. A member in dry
// run for the key binds only when no member is enforced for it.
func (d Decision) Binding() int {
	var ms [MaxMembers]Decision
	for i, m := range d.Members() {
		ms[i] = m
	}
	return binding(ms[:d.memberCount()], d.dryMembers())
}

// dryMembers is the bit set of d's members that were in dry run for the
// call's key.
func (d Decision) dryMembers() uint8 {
	var dry uint8
	for i := range int(d.nMembers) {
		if d.memberAt(i).limit&dryBit != 0 {
			dry |= 1 << i
		}
	}
	return dry
}

// binding is Binding over ms, members in the bit set dry excluded (none is
// when all are).
func binding(ms []Decision, dry uint8) int {
	if dry == 1<<len(ms)-1 {
		dry = 0
	}
	b := -1
	denied := false
	for i := range ms {
		denied = denied || !ms[i].Allowed
	}
	for i := range ms {
		m := &ms[i] // by pointer: a Decision is 14 words
		if denied && m.Allowed || dry&(1<<i) != 0 {
			continue
		}
		if b < 0 {
			b = i
			continue
		}
		o := &ms[b]
		better := m.Remaining < o.Remaining
		same := m.Remaining == o.Remaining
		if denied {
			better, same = m.RetryAfter > o.RetryAfter, m.RetryAfter == o.RetryAfter
		}
		if better || same && m.ResetAt.After(o.ResetAt) {
			b = i
		}
	}
	return b
}

// errNoComposites answers a composite on a Throttler whose backend (or
// fallback) takes none: bad input, never a failure mode.
var errNoComposites = fmt.Errorf("%w: a composite needs a backend whose Traits say Composites "+
	"(and a fallback that does too); this Throttler's takes one policy per call", ErrInvalidPolicy)

// SupportsComposites reports whether t takes composite policies (see All):
// whether its backend, and its fallback if any, say Composites in their
// Traits. Constructors that are given a composite check it when they are
// built.
func (t *Throttler) SupportsComposites() bool { return t != nil && t.composites }

// refundComposite is Refund for a composite: each member gets n back under
// its own receipt, the ResetAt of its Decision in taken's Members, through
// the Throttler's whole path (its store's breaker, the fallback), one
// member after another. Refunds only give back, so they need not be atomic
// together. The error matches ErrNotRefunded only when no member refunded;
// any other member's error is returned, joined.
// Its At is the binding member's call's.
func (t *Throttler) refundComposite(ctx context.Context, key string, p Policy, n int64, taken Decision) (Decision, error) {
	if !t.composites {
		return Decision{}, errNoComposites
	}
	if err := p.Validate(); err != nil {
		return Decision{}, err
	}
	ms := p.all.members
	// Allowed and Degraded are checked on the composite (a member of a
	// denied composite says Allowed when it would have admitted, though
	// nothing was counted); whether what counted the units has ended, on
	// each member, whose ResetAt is its own. A composite whose members have
	// their own enforcement says WouldDeny when one of them would have
	// denied: the others counted the units, and that one's Refund is
	// ErrNotRefunded.
	why := ""
	if !taken.Allowed || taken.Degraded || taken.WouldDeny && p.enforce != memberEnforcement {
		why = unrefundable(taken, taken.ResetAt.Add(-1)) // before any ResetAt: only these two reasons
	}
	if why == "" && taken.memberCount() != len(ms) {
		why = fmt.Sprintf("the Decision names %d members, the composite has %d", taken.memberCount(), len(ms))
	}
	if why != "" {
		return Decision{}, fmt.Errorf("%w: %s", ErrNotRefunded, why)
	}
	var out [MaxMembers]Decision
	var at [MaxMembers]time.Time
	var errs []error
	refunded := false
	for i, m := range ms {
		d, err := t.Refund(ctx, key, m, n, taken.member(i))
		switch {
		case err == nil:
			refunded = true
		case errors.Is(err, ErrNotRefunded):
			// What counted this member's units has ended: its state as it
			// stands, for the composite's Decision.
			d, err = t.Peek(ctx, key, m)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("member %d: %w", i, err))
		}
		out[i], at[i] = d, d.At
	}
	if len(errs) > 0 {
		return Decision{}, errors.Join(errs...)
	}
	if !refunded {
		return Decision{}, fmt.Errorf("%w: no member's state still holds the units", ErrNotRefunded)
	}
	d := combine(out[:len(ms)], taken.dryMembers())
	d.At = at[d.Binding()]
	return d, nil
}

// refuseComposite answers r, a composite's call on a Throttler that takes
// none, with errNoComposites, observed as bad input is.
//
//go:noinline
func (t *Throttler) refuseComposite(r *request) (Decision, error) {
	if t.opts.Observe != nil {
		t.observe(r, "", Decision{}, SourceNone, errNoComposites)
	}
	return Decision{}, errNoComposites
}

// markDegraded marks a fallback's composite Decision's members Degraded too,
// on a copy of them: the backend's Decision may share them.
func markDegraded(d *Decision) {
	m := *d.members
	d.members = &m
	for i := range int(d.nMembers) {
		d.memberAt(i).limit |= degradedBit
	}
}

// subset is the policy of c's members at the indexes idx (in order): the
// one member itself, or a composite of them. Built per call, on the path of
// a would-be denial only (doByMember).
func (c *composite) subset(idx []int) Policy {
	if len(idx) == 1 {
		return c.members[idx[0]]
	}
	members := make([]Policy, len(idx))
	for j, i := range idx {
		members[j] = c.members[i]
	}
	return Policy{all: newComposite(members)}
}

package shadow

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// compareMembers is compare for a composite's members (throttler.All): the
// kinds by which any member's Decision differs, each member compared as a
// single policy's; the members' count differing (one side answered the
// composite, the other did not) is AllowedDiffers and UsedDiffers. Nothing
// for two single policies' Decisions.
func compareMembers(control, candidate throttler.Decision, usedTol int64, resetTol time.Duration) Kind {
	var k Kind
	var cands [throttler.MaxMembers]throttler.Decision
	n := 0
	for i, d := range candidate.Members() {
		cands[i], n = d, i+1
	}
	seen := 0
	for i, c := range control.Members() {
		seen = i + 1
		if i < n {
			k |= compare(c, cands[i], usedTol, resetTol)
		}
	}
	if seen != n {
		k |= AllowedDiffers | UsedDiffers
	}
	return k
}

// explainsMembers is explains for a composite's call: the rule is applied to each member whose
// Decisions differ, as to that member's own call, and explains the pair only if it explains every
// one of them. The composite's own fields are its binding member's, which reordering can make
// another member on each side (then their Limits differ), and which hide the other members; and
// its Policy has no Window of its own. Both sides must answer every member.
//
// A member whose composite was denied while it would have admitted counted nothing and shows its
// state as it stands; in a Take it is compared as its own Take would have answered (see taken), so
// that a composite whose Allowed flips near one member's limit differs in each member no more than
// single policies' calls would: the flipping member by its own rule, the others not at all.
func (o reorder) explainsMembers(r *Result) bool {
	var cs, ks [throttler.MaxMembers]throttler.Decision
	nc, nk, n := collect(r.Control, &cs), collect(r.Candidate, &ks), 0
	for i, p := range r.Policy.Members() {
		n = i + 1
		if i >= nc || i >= nk {
			return false
		}
		c, k := cs[i], ks[i]
		if r.Op == throttler.OpTake {
			c, k = taken(c, r.Control.Allowed, p, r.Cost, r.Now), taken(k, r.Candidate.Allowed, p, r.Cost, r.Now)
		}
		if compare(c, k, o.usedTol, o.resetTol)&differs == 0 {
			continue
		}
		m := Result{Op: r.Op, Policy: p, Cost: r.Cost, Receipt: r.Receipt, Now: r.Now, Control: c, Candidate: k, Lag: r.Lag}
		if !o.explains(&m) {
			return false
		}
	}
	return n > 0 && n == nc && n == nk
}

// collect puts d's members' Decisions in ms and returns how many there are.
func collect(d throttler.Decision, ms *[throttler.MaxMembers]throttler.Decision) int {
	n := 0
	for i, m := range d.Members() {
		ms[i], n = m, i+1
	}
	return n
}

// taken returns a member's Decision m in a composite's Take answered with allowed as the member's
// own Take of cost at now would have answered: m itself unless the composite was denied and the
// member would have admitted, which counted nothing. Then the cost is counted in Used and
// Remaining (on every algorithm a Take adds its cost to Used), and ResetAt moves as a Take moves
// it: a bucket's later by the cost's refill time (rounded up: at most a ms later than the store's),
// a log's to at least now + Window (its newest entry would be now); a window's stays.
func taken(m throttler.Decision, allowed bool, p throttler.Policy, cost int64, now time.Time) throttler.Decision {
	if allowed || !m.Allowed || cost <= 0 {
		return m
	}
	m.Used += cost
	m.Remaining = max(0, m.Remaining-cost)
	w := p.Window.Milliseconds()
	switch {
	case w <= 0 || p.Limit <= 0:
	case p.Algorithm == throttler.TokenBucket:
		// cost is at most the capacity, and capacity·w fits an exact double (a valid bucket's):
		// the product cannot overflow unless the policy is invalid, which no store admitted.
		if c := min(cost, p.Capacity()); c > 0 && c <= (1<<62)/w {
			m.ResetAt = m.ResetAt.Add(time.Duration((c*w+p.Limit-1)/p.Limit) * time.Millisecond)
		}
	case p.Algorithm == throttler.SlidingLog:
		if end := time.UnixMilli(now.UnixMilli() + w); end.After(m.ResetAt) {
			m.ResetAt = end
		}
	}
	return m
}

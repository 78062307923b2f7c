package model

import (
	"sort"

	"github.com/throttlekit/throttlekit/throttler"
)

// Traits says that the model takes composites (see throttler.All).
func (m *Model) Traits() throttler.Traits { return throttler.Traits{Composites: true} }

// TryComposite is Try for a composite p (OpTake or OpPeek; a composite is
// refunded member by member), from no state for every member when dropped
// is set. It holds the model's lock from the first member's answer to the
// last, and commits every member's state or none.
func (m *Model) TryComposite(op throttler.Op, key string, p throttler.Policy, cost, r, t int64, dropped bool) (throttler.Decision, func()) {
	var drops []bool
	for range p.Members() {
		drops = append(drops, dropped)
	}
	return m.TryMembers(op, key, p, cost, t, drops)
}

// TryMembers is TryComposite reading member i from no state when drops[i]
// is set: a backend may have dropped any of the members' ended states.
func (m *Model) TryMembers(op throttler.Op, key string, p throttler.Policy, cost, t int64, drops []bool) (throttler.Decision, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ds []throttler.Decision
	var commits []func()
	admitted := true
	for i, mp := range p.Members() {
		d, commit := m.tryLocked(op, key, mp, cost, 0, t, drops[i])
		ds, commits = append(ds, d), append(commits, commit)
		admitted = admitted && d.Allowed
	}
	if op == throttler.OpTake && !admitted {
		// Nothing is counted anywhere: a denying member says what its own
		// denied Take says (which stores nothing, but a drop), and one that
		// would have admitted says how it stands, as a Peek says.
		for i, mp := range p.Members() {
			if ds[i].Allowed {
				ds[i], commits[i] = m.tryLocked(throttler.OpPeek, key, mp, 1, 0, t, drops[i])
			}
		}
	}
	return modelCombine(ds), func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, c := range commits {
			c()
		}
	}
}

// modelCombine is the composite Decision of the members' ds, by the rules
// of throttler.Backend, written apart from throttler.Combine, which builds
// the Decision that carries the members (and whose own fields are then
// replaced by the model's).
func modelCombine(ds []throttler.Decision) throttler.Decision {
	allowed := true
	least := ds[0].Remaining
	for _, d := range ds {
		allowed = allowed && d.Allowed
		least = min(least, d.Remaining)
	}
	// The binding member: sort the candidates, best first.
	var cand []int
	for i, d := range ds {
		if allowed || !d.Allowed {
			cand = append(cand, i)
		}
	}
	sort.SliceStable(cand, func(x, y int) bool {
		a, b := ds[cand[x]], ds[cand[y]]
		if allowed && a.Remaining != b.Remaining {
			return a.Remaining < b.Remaining
		}
		if !allowed && a.RetryAfter != b.RetryAfter {
			return a.RetryAfter > b.RetryAfter
		}
		return a.ResetAt.After(b.ResetAt)
	})
	bind := ds[cand[0]]
	out := throttler.Combine(ds)
	out.Allowed, out.Limit, out.Used, out.Remaining = allowed, bind.Limit, bind.Used, least
	out.ResetAt, out.RetryAfter, out.Degraded = bind.ResetAt, 0, false
	if !allowed {
		out.RetryAfter = bind.RetryAfter
	}
	return out
}

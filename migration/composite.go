package migration

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Composites (throttler.All) through a Migration ("Moving keys" in
// docs/migration.md).
//
// A Migration takes composites when both stores do (its Traits say so). A
// key that is not moving sends its composite, as it is, to the store that
// serves it, through that store's shadow, which mirrors it and compares each
// member. A moving key's composite goes to both stores by the single
// policy's rules, applied member by member, and is all or nothing across
// both stores:
//
//   - With a fixed-window member, the store the key comes from (o) takes the
//     composite first, at now, in one atomic call. If it denies, the other
//     store (s) is not called: nothing is spent anywhere. If it admits, s
//     takes every member at that member's own instant: a fixed-window
//     member's at the start of its window in o (as phased does for one
//     policy), any other member's at now. When those instants fall in one
//     ms, that is one atomic composite Take on s; otherwise s takes the
//     members one by one, and the first that denies (or fails) ends it: s is
//     refunded the members it admitted, each under its own receipt at its
//     own instant, and o the composite, member by member. So on s a
//     composite whose members count at several instants is all or nothing
//     once the call returns, not atomically during it: a concurrent call may
//     see a member counted that is then refunded, which only makes it
//     stricter (the single policy's compensation does as much).
//   - Otherwise both stores take the composite at once, each atomically; when
//     one admits and the other denies, the admitting one is refunded member
//     by member under each member's receipt, and the denial is the answer.
//   - When both admit (or, taken at once, both deny), each token-bucket
//     member of s is leveled down to o's, as level does for one policy, and
//     the answer is the stricter of the two stores' answers member by member
//     (inPhase for a fixed-window member called in phase), combined
//     (throttler.Combine).
//   - A Peek goes to both at once; its answer is combined in the same way.
//
// A key is moving for the longest horizon of the composite's members
// (horizon), so every member's rule holds as long as it would alone. A
// member taken alone as well moves for its own horizon: its calls alone
// may go to s alone while the composite's still go to both, where o is then
// the laxer for that member and s, exact, decides.

// errComposite answers a composite when a store takes none (its Traits do
// not say Composites): the Migration's Traits say so too, so a Throttler
// over it refuses a composite before calling it.
var errComposite = fmt.Errorf("%w: a Migration takes composite policies only when both its stores do", throttler.ErrInvalidPolicy)

// members holds a composite's members, or their Decisions, in order.
type members[T any] struct {
	v [throttler.MaxMembers]T
	n int
}

func policies(p throttler.Policy) (ms members[throttler.Policy]) {
	for i, m := range p.Members() {
		ms.v[i], ms.n = m, i+1
	}
	return ms
}

func decisions(d throttler.Decision) (ms members[throttler.Decision]) {
	for i, m := range d.Members() {
		ms.v[i], ms.n = m, i+1
	}
	return ms
}

// hasFixedWindow reports whether a composite has a fixed-window member.
func hasFixedWindow(p throttler.Policy) bool {
	for _, mp := range p.Members() {
		if mp.Algorithm == throttler.FixedWindow {
			return true
		}
	}
	return false
}

// stricterMembers is the answer to a composite's call that both stores
// answered alike (both admitted, or both denied, or a Peek): member by
// member the stricter, combined; after a Take, s's token-bucket members
// leveled.
func (m *Migration) stricterMembers(ctx context.Context, op throttler.Op, key string, p throttler.Policy, s store, sd, od throttler.Decision, now time.Time) throttler.Decision {
	ps, sds, ods := policies(p), decisions(sd), decisions(od)
	if sds.n != ps.n || ods.n != ps.n {
		// A store answered a composite without its members: the whole.
		return stricter(sd, od)
	}
	if op == throttler.OpTake {
		m.levelMembers(ctx, s, key, ps, &sds, &ods, now)
	}
	var out [throttler.MaxMembers]throttler.Decision
	for i := range ps.n {
		out[i] = stricter(sds.v[i], ods.v[i])
	}
	return throttler.Combine(out[:ps.n])
}

// phasedComposite is both for a Take of a composite with a fixed-window
// member: o takes the composite at now; if it admits, s takes
// each member at its own instant, in one composite Take when those fall in
// one ms. See the rules above.
func (m *Migration) phasedComposite(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time, s, o store) (throttler.Decision, error) {
	ps := policies(p)
	od, oerr := o.b.Take(ctx, key, p, cost, now)
	if oerr != nil {
		sd, serr := s.b.Take(ctx, key, p, cost, now)
		if serr != nil {
			return throttler.Decision{}, serr
		}
		m.moving.oneStore.Add(1)
		return sd, nil
	}
	ods := decisions(od)
	if !od.Allowed || ods.n != ps.n {
		return od, nil
	}
	// Each member's instant on s: a fixed window's at the start of its
	// window in o (even after now: see phased), any other's at now.
	var at [throttler.MaxMembers]time.Time
	one := true
	for i, mp := range ps.v[:ps.n] {
		at[i] = now
		if mp.Algorithm == throttler.FixedWindow && !ods.v[i].ResetAt.IsZero() {
			at[i] = ods.v[i].ResetAt.Add(-mp.Window)
		}
		// Stores count whole ms: instants within one ms are one.
		one = one && at[i].UnixMilli() == at[0].UnixMilli()
	}
	var sds members[throttler.Decision]
	if one {
		sd, serr := s.b.Take(ctx, key, p, cost, at[0])
		if serr != nil {
			m.compensateMembers(ctx, o, key, ps, cost, ods, nil, now)
			return throttler.Decision{}, serr
		}
		if !sd.Allowed {
			// Nothing was counted on s: o is refunded.
			m.compensateMembers(ctx, o, key, ps, cost, ods, nil, now)
		}
		if sds = decisions(sd); sds.n != ps.n {
			// A store answered a composite without its members: the whole.
			return inPhase(od, sd, now), nil
		}
	} else {
		for i, mp := range ps.v[:ps.n] {
			d, err := s.b.Take(ctx, key, mp, cost, at[i])
			if err == nil {
				sds.v[i], sds.n = d, i+1
			}
			if err != nil || !d.Allowed {
				// s keeps none of the members it took, nor o the composite.
				m.compensateMembers(ctx, s, key, ps, cost, members[throttler.Decision]{v: sds.v, n: i}, &at, now)
				m.compensateMembers(ctx, o, key, ps, cost, ods, nil, now)
				if err != nil {
					return throttler.Decision{}, err
				}
				break
			}
		}
	}
	var out [throttler.MaxMembers]throttler.Decision
	allowed := true
	for i := range ps.n {
		switch {
		case i >= sds.n:
			out[i] = ods.v[i] // s was not asked: o's answer
		case ps.v[i].Algorithm == throttler.FixedWindow:
			out[i] = inPhase(ods.v[i], sds.v[i], now)
		default:
			out[i] = stricter(sds.v[i], ods.v[i])
		}
		allowed = allowed && out[i].Allowed
	}
	if allowed {
		m.levelMembers(ctx, s, key, ps, &sds, &ods, now)
	}
	return throttler.Combine(out[:ps.n]), nil
}

// levelMembers levels each token-bucket member of s down to o (see level).
func (m *Migration) levelMembers(ctx context.Context, s store, key string, ps members[throttler.Policy], sds, ods *members[throttler.Decision], now time.Time) {
	for i, mp := range ps.v[:ps.n] {
		if mp.Algorithm == throttler.TokenBucket && i < sds.n && i < ods.n {
			m.level(ctx, s, key, mp, sds.v[i], ods.v[i], now)
		}
	}
}

// compensateMembers refunds cost to the first ds.n members of st, each
// under its own receipt (its Decision's ResetAt) at its own instant (at, or
// now when at is nil), counting one compensation, and one failed Refund if
// any member's failed (see compensate).
func (m *Migration) compensateMembers(ctx context.Context, st store, key string, ps members[throttler.Policy], cost int64, ds members[throttler.Decision], at *[throttler.MaxMembers]time.Time, now time.Time) {
	if ds.n == 0 {
		return
	}
	m.moving.compensated.Add(1)
	failed := false
	for i := range min(ds.n, ps.n) {
		t := now
		if at != nil {
			t = at[i]
		}
		if _, err := st.b.Refund(ctx, key, ps.v[i], cost, ds.v[i].ResetAt, t); err != nil {
			failed = true
		}
	}
	if failed {
		m.moving.refundFailed.Add(1)
	}
}

package migration

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// Leases through a Migration.
//
// A Migration holds leases when both stores do (its router's HoldsLeases).
// A lease call goes through the router to the serving store's shadow, as a
// Take does: the serving store grants the lease and the shadow mirrors it,
// with its LeaseID, to the other store, so that with mirroring on both hold
// the same leases. The router remembers which shadow granted each lease and
// sends its Release there however the percentage moved since (see
// flags.Router.Release); that shadow releases it on its store and mirrors
// the Release to the other.
//
// A mirrored Acquire may lag, or be dropped, so right after a change the
// store a key moves to may not yet hold the leases granted just before it.
// So, as for rate limits, a key a change moves is moving for the lease's TTL
// plus Settle (after that every lease granted before the change has
// expired): its Acquire is made on both stores, synchronously, and granted
// only if both grant it (one that grants alone is released at once); its
// Release, while the key is moving, goes to both stores. A lease granted
// while the key moves and released after goes to the router, which does not
// know it and releases it on both shadows, the serving one first: if that
// one held it, the other store may keep it until its TTL (mirroring off),
// which only ever makes it stricter.

var (
	_ throttler.LeaseBackend = (*Migration)(nil)
	_ backend.LeaseHolder    = (*Migration)(nil)
	_ backend.LeaseStores    = (*Migration)(nil)
)

// Acquire takes lease id on key under p: through the serving store's
// shadow, or on both stores for a moving key. It does not validate: the
// stores do.
func (m *Migration) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	mv := m.moves
	if mv == nil || !m.router.HoldsLeases() {
		return m.router.Acquire(ctx, key, p, id, now)
	}
	// The route comes from the one reading of the percentage that decided
	// whether the key is moving, as for a Take: read again, a change in
	// between could send a key that moved to its new store alone.
	pct := min(max(mv.pct.Percent(), 0), 100)
	var toNew, moving bool
	if h := mv.hist.Load(); pct == h.cur && len(h.marks) == 0 {
		toNew = pct == 100 || pct > 0 && mv.bucket.Bucket(key) <= pct
	} else if toNew, moving = mv.routeWithin(h, pct, key, p.TTL); moving {
		return m.acquireBoth(ctx, key, p, id, now, toNew)
	}
	return m.router.AcquireOn(ctx, toNew, key, p, id, now)
}

// Release gives lease id back: through the router to the shadow that
// granted it, when the router knows it; otherwise (the key was moving when
// it was granted on both stores, or the router forgot it) on both stores,
// the serving store's answer being the call's, or for a moving key the
// stricter one.
func (m *Migration) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	held, d, known, err := m.router.ReleaseKnown(ctx, key, p, id, now)
	if known || err != nil {
		return held, d, err
	}
	toNew, moving := m.leaseMoving(key, p)
	if !moving {
		toNew = m.rollout.UseNew(key)
	}
	return m.releaseBoth(ctx, key, p, id, now, toNew, moving)
}

// leaseMoving reports whether key's leases under p are moving, and where
// the key is routed now; never for a Migration without leases, whose router
// answers ErrLeasesUnsupported.
func (m *Migration) leaseMoving(key string, p throttler.ConcurrencyPolicy) (toNew, moving bool) {
	mv := m.moves
	if mv == nil || !m.router.HoldsLeases() {
		return false, false
	}
	pct := min(max(mv.pct.Percent(), 0), 100)
	if h := mv.hist.Load(); pct != h.cur || len(h.marks) != 0 {
		return mv.routeWithin(h, pct, key, p.TTL)
	}
	return false, false
}

// leaseStores returns the serving store and the other as lease backends.
func (m *Migration) leaseStores(toNew bool) (s, o throttler.LeaseBackend, sNew bool) {
	old, _ := backend.Leases(m.stores[0].b)
	new, _ := backend.Leases(m.stores[1].b)
	if toNew {
		return new, old, true
	}
	return old, new, false
}

// acquireBoth acquires on both stores: granted only if both grant it, and
// then the stricter of the two decisions. A store that grants when the
// other denies is released at once; the serving store failing is the
// call's error; the other failing leaves the serving store's answer
// (counted in MovingStats.OneStore). Nothing is mirrored.
func (m *Migration) acquireBoth(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time, toNew bool) (throttler.Decision, error) {
	m.count(toNew)
	s, o, sNew := m.leaseStores(toNew)
	od, oerr := o.Acquire(ctx, key, p, id, now)
	sd, serr := s.Acquire(ctx, key, p, id, now)
	switch {
	case serr != nil:
		if oerr == nil && od.Allowed {
			m.undo(ctx, o, key, p, id, now)
		}
		return throttler.Decision{}, m.wrap(serr, sNew)
	case oerr != nil:
		m.moving.oneStore.Add(1)
		return sd, nil
	case sd.Allowed && !od.Allowed:
		m.undo(ctx, s, key, p, id, now)
		return od, nil
	case !sd.Allowed && od.Allowed:
		m.undo(ctx, o, key, p, id, now)
		return sd, nil
	}
	return stricter(sd, od), nil
}

// releaseBoth releases on both stores, directly (nothing is mirrored):
// held and the decision are the serving store's, or for a moving key the
// stricter decision. The serving store failing is the call's error; the
// other failing is counted in MovingStats.OneStore for a moving key.
func (m *Migration) releaseBoth(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time, toNew, moving bool) (bool, throttler.Decision, error) {
	if moving {
		m.count(toNew)
	} else if toNew {
		m.newCalls.Add(1)
	} else {
		m.oldCalls.Add(1)
	}
	s, o, sNew := m.leaseStores(toNew)
	held, sd, serr := s.Release(ctx, key, p, id, now)
	_, od, oerr := o.Release(ctx, key, p, id, now)
	switch {
	case serr != nil:
		return false, throttler.Decision{}, m.wrap(serr, sNew)
	case !moving:
		return held, sd, nil
	case oerr != nil:
		m.moving.oneStore.Add(1)
		return held, sd, nil
	}
	return held, stricter(sd, od), nil
}

// undo releases a lease one store granted and the call did not, counted
// as a compensation.
func (m *Migration) undo(ctx context.Context, b throttler.LeaseBackend, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) {
	m.moving.compensated.Add(1)
	if _, _, err := b.Release(ctx, key, p, id, now); err != nil {
		m.moving.refundFailed.Add(1)
	}
}

// count counts a moving key's call.
func (m *Migration) count(toNew bool) {
	m.moving.calls.Add(1)
	if toNew {
		m.newCalls.Add(1)
	} else {
		m.oldCalls.Add(1)
	}
}

// routed is Stats.Routed: the Migration's own counts of rate calls and
// moving keys' calls, and the router's of the lease calls it routed.
func (m *Migration) routed() flags.Stats {
	rs := m.router.Stats()
	return flags.Stats{Old: m.oldCalls.Load() + rs.Old, New: m.newCalls.Load() + rs.New, Leases: rs.Leases}
}

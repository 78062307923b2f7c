package migration

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Leases through a Migration.
//
// A Migration holds leases when both stores do (its Traits say so).
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
// expired): the strategy sends its Acquire to both stores, synchronously,
// granted only if both grant it (one that grants alone is released at
// once). A lease the router does not remember (granted while the key was
// moving, or forgotten) is released on both stores directly, the serving
// store's answer being the call's (for a moving key, the stricter one): not
// through the shadows, since both stores may hold a mirrored copy, and
// "either held it" would report the copy.

// A Migration over a store without leases has the lease methods, but says
// so in its Traits and answers them with throttler.ErrLeasesUnsupported.
var _ throttler.LeaseBackend = (*Migration)(nil)

// Acquire takes lease id on key under p: through the serving store's
// shadow, or on both stores for a moving key. It does not validate: the
// stores do.
func (m *Migration) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	return m.router.Acquire(ctx, key, p, id, now)
}

// Release gives lease id back: through the router to the shadow that
// granted it, when the router knows it; otherwise (the key was moving when
// it was granted on both stores, or the router forgot it) on both stores.
func (m *Migration) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	return m.router.Release(ctx, key, p, id, now)
}

// leaseStores returns the serving store and the other.
func (m *Migration) leaseStores(toNew bool) (s, o throttler.LeaseBackend) {
	if toNew {
		return m.leases[1], m.leases[0]
	}
	return m.leases[0], m.leases[1]
}

// acquireBoth acquires on both stores: granted only if both grant it, and
// then the stricter of the two decisions. A store that grants when the
// other denies is released at once; the serving store failing is the
// call's error (the router names the store); the other failing leaves the
// serving store's answer (counted in Stats.Moving.OneStore). Nothing is
// mirrored.
func (m *Migration) acquireBoth(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time, toNew bool) (throttler.Decision, error) {
	m.moving.calls.Add(1)
	s, o := m.leaseStores(toNew)
	od, oerr := o.Acquire(ctx, key, p, id, now)
	sd, serr := s.Acquire(ctx, key, p, id, now)
	switch {
	case serr != nil:
		if oerr == nil && od.Allowed {
			m.undo(ctx, o, key, p, id, now)
		}
		return throttler.Decision{}, serr
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
// other failing is counted in Stats.Moving.OneStore for a moving key.
func (m *Migration) releaseBoth(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time, toNew, moving bool) (bool, throttler.Decision, error) {
	if moving {
		m.moving.calls.Add(1)
	}
	s, o := m.leaseStores(toNew)
	held, sd, serr := s.Release(ctx, key, p, id, now)
	_, od, oerr := o.Release(ctx, key, p, id, now)
	switch {
	case serr != nil:
		return false, throttler.Decision{}, serr
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

package model

import (
	"context"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// LeaseModel is the reference model of the lease contract
// (throttler/lease.go): a throttler.LeaseBackend written for clarity, not
// speed, independently of leaseset.Set. A key's state is a map from
// lease ID to expiry (Unix ms); every call first deletes the leases whose
// expiry is <= now, as the contract says.
//
// It keeps every state until its last lease is dropped, which is what a
// backend answers too unless it dropped state that had ended (every lease
// expired) by the latest now it was given; the differential traces allow
// for exactly that. It is safe for concurrent use.
type LeaseModel struct {
	mu   sync.Mutex
	sets map[modelKey]map[throttler.LeaseID]int64
}

// NewLeaseModel returns an empty model.
func NewLeaseModel() *LeaseModel {
	return &LeaseModel{sets: map[modelKey]map[throttler.LeaseID]int64{}}
}

var _ throttler.LeaseBackend = (*LeaseModel)(nil)

// Acquire implements throttler.LeaseBackend.
func (m *LeaseModel) Acquire(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return throttler.Decision{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, d, k, live := m.compute(true, key, p, id, now.UnixMilli(), false)
	m.store(k, live)
	return d, nil
}

// Release implements throttler.LeaseBackend.
func (m *LeaseModel) Release(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return false, throttler.Decision{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	held, d, k, live := m.compute(false, key, p, id, now.UnixMilli(), false)
	m.store(k, live)
	return held, d, nil
}

// Try computes an Acquire (or a Release) of id at t without storing
// anything, from no state at all when dropped is set; commit stores what
// the call would, the drop included.
func (m *LeaseModel) Try(acquire bool, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64, dropped bool) (held bool, d throttler.Decision, commit func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	held, d, k, live := m.compute(acquire, key, p, id, t, dropped)
	return held, d, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.store(k, live)
	}
}

// compute is Try's answer and the state the call leaves (live), with m.mu
// held.
func (m *LeaseModel) compute(acquire bool, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64, dropped bool) (held bool, d throttler.Decision, k modelKey, live map[throttler.LeaseID]int64) {
	k = modelKey{identity.Lease(p), key}
	// The leases held at t: a copy, so that nothing is stored before
	// commit.
	live = map[throttler.LeaseID]int64{}
	if !dropped {
		for l, expiry := range m.sets[k] {
			if expiry > t {
				live[l] = expiry
			}
		}
	}
	_, held = live[id]
	allowed := false
	if acquire {
		if held || int64(len(live)) < p.Limit {
			live[id] = t + p.TTL.Milliseconds()
			allowed = true
		}
	} else {
		delete(live, id)
		allowed = int64(len(live)) < p.Limit
	}
	resetAt := t + p.TTL.Milliseconds()
	first := true
	for _, expiry := range live {
		if first || expiry < resetAt {
			resetAt, first = expiry, false
		}
	}
	used := int64(len(live))
	d = throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(0, p.Limit-used), ResetAt: time.UnixMilli(resetAt)}
	if !allowed {
		d.RetryAfter = time.Duration(resetAt-t) * time.Millisecond
	}
	if acquire {
		held = false // an Acquire reports no held
	}
	return held, d, k, live
}

// store keeps live as the state of k, with m.mu held.
func (m *LeaseModel) store(k modelKey, live map[throttler.LeaseID]int64) {
	if len(live) == 0 {
		delete(m.sets, k)
	} else {
		m.sets[k] = live
	}
}

// End returns when the leases of (p, key) stop mattering, in Unix ms: the
// latest expiry among them; false when none is stored.
func (m *LeaseModel) End(key string, p throttler.ConcurrencyPolicy) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.sets[modelKey{identity.Lease(p), key}]
	if len(set) == 0 {
		return 0, false
	}
	end, first := int64(0), true
	for _, expiry := range set {
		if first || expiry > end {
			end, first = expiry, false
		}
	}
	return end, true
}

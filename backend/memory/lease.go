package memory

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// Leases (throttler.LeaseBackend): a concurrency limit's leases live in a
// slot of the key's shard like any window, as a leaseset.Set whose
// array the slot keeps, so that a steady Acquire and Release on a live key
// allocate nothing. The slot's end is the latest expiry it ever held (an
// upper bound of the set's End, which drops only lower it): cleanup drops
// it Lag after that, as it drops an ended window, and MaxKeys counts it.
// An emptied set keeps its slot until then, so that a key that is released
// and acquired again reuses it.

var _ throttler.LeaseBackend = (*Backend)(nil)

// leaseAlg marks a concurrency limit's identity in a slot: no rate
// algorithm has it, so a lease set never meets a window of the same name.
const leaseAlg = throttler.Algorithm(255)

// leaseIdent is the storage identity number of p: (Name, key) for a named
// policy, the whole definition for an unnamed one (see
// identity.Lease); from the locked shard s's memo when p is the
// concurrency policy its last lease call named.
func (b *Backend) leaseIdent(s *shard, p throttler.ConcurrencyPolicy) uint32 {
	m := &s.lastLease
	if m.id != 0 && p.Name == m.name && p.Limit == m.limit && int64(p.TTL) == m.window {
		return m.id
	}
	id := policyID{name: p.Name, alg: leaseAlg}
	if p.Name == "" {
		id = policyID{limit: p.Limit, window: int64(p.TTL), alg: leaseAlg}
	}
	*m = lastPolicy{name: p.Name, limit: p.Limit, window: int64(p.TTL), alg: leaseAlg, id: b.ids.number(id)}
	return m.id
}

// Acquire takes a lease of id on key under p, by the lease contract.
func (b *Backend) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return throttler.Decision{}, err
	}
	ms := now.UnixMilli()
	s, h := b.lock(key)
	if b.observe(s, ms) {
		b.sweep(s, ms, true)
	}
	pid := b.leaseIdent(s, p)
	w := s.table.find(h, key, pid)
	if w == nil {
		// No leases: this one is admitted (Limit >= 1) and needs a slot.
		var err error
		if w, err = b.makeSlot(s, h, key, pid, kindLease, ms); err != nil {
			s.mu.Unlock()
			return throttler.Decision{}, err
		}
		s.table.extraOf(w).leases, w.end = new(leaseset.Set), ms
	}
	used, earliest, allowed, _ := s.table.extraOf(w).leases.Hold(p, id, ms)
	if allowed {
		w.end = max(w.end, ms+p.TTL.Milliseconds())
	}
	s.mu.Unlock()
	return leaseset.Decision(p, used, earliest, ms, allowed), nil
}

// Release gives back the lease of id on key under p, by the lease
// contract; a key with no leases stored answers without storing any.
func (b *Backend) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return false, throttler.Decision{}, err
	}
	ms := now.UnixMilli()
	s, h := b.lock(key)
	if b.observe(s, ms) {
		b.sweep(s, ms, true)
	}
	var none leaseset.Set
	set := &none
	if w := s.table.find(h, key, b.leaseIdent(s, p)); w != nil {
		set = s.table.extraOf(w).leases
	}
	held, used, earliest, _ := set.Drop(id, ms)
	s.mu.Unlock()
	return held, leaseset.Decision(p, used, earliest, ms, used < p.Limit), nil
}

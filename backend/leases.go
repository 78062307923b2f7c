package backend

import (
	"math"
	"strconv"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// The lease contract's arithmetic (throttler.LeaseBackend's doc, pinned to the
// millisecond), for the backends written in Go (memory, Memcached); the
// Redis scripts compute the same in Lua. A LeaseSet is one key's state; its
// methods take the call's instant t in Unix ms (now truncated) and answer
// with the contract's Decision. Inputs must have passed
// throttler.ValidateLease.

// LeaseEntry is one held lease: its ID and its expiry in Unix ms. It is not
// held at an instant t >= Expiry.
type LeaseEntry struct {
	ID     throttler.LeaseID
	Expiry int64
}

// LeaseSet is the leases stored for one (policy, key), in no particular
// order, each ID at most once. A Memcached backend converts its decoded
// entries (LeaseSet(entries)) and encodes the set after a call that
// changed it; the memory backend keeps one per key and reuses its array,
// so that a steady Acquire and Release allocate nothing. The zero value
// (nil) holds nothing. Each call costs one pass over the entries (at most
// throttler.MaxConcurrencyLimit plus those expired since the last call).
type LeaseSet []LeaseEntry

// Acquire applies an Acquire of id at t under p: it drops the leases
// expired by t, then holds id until t + TTL if it is held already (a
// refresh, counted once) or fewer than p.Limit are held. changed reports
// whether the set changed (a drop, a lease taken or refreshed): the state
// to write.
func (s *LeaseSet) Acquire(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (d throttler.Decision, changed bool) {
	used, earliest, allowed, changed := s.Hold(p, id, t)
	return LeaseDecision(p, used, earliest, t, allowed), changed
}

// Hold is Acquire without building its Decision: the leases held after the
// call, the earliest expiry among them, and whether id was admitted
// (LeaseDecision makes the Decision of them). Hot paths call it to build
// the Decision once, outside their lock.
func (s *LeaseSet) Hold(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (used, earliest int64, allowed, changed bool) {
	expiry := t + p.TTL.Milliseconds()
	e := *s
	n, found := 0, -1
	earliest = math.MaxInt64
	for i := range e {
		x := e[i]
		if x.Expiry <= t {
			continue
		}
		if x.ID == id {
			found = n
		} else {
			earliest = min(earliest, x.Expiry)
		}
		if n != i { // writes only after a drop
			e[n] = x
		}
		n++
	}
	changed = n != len(e)
	clear(e[n:])
	e = e[:n]
	allowed = true
	switch {
	case found >= 0:
		changed = changed || e[found].Expiry != expiry
		e[found].Expiry = expiry
	case int64(n) < p.Limit:
		e = append(e, LeaseEntry{ID: id, Expiry: expiry})
		changed = true
	default:
		allowed = false
	}
	*s = e
	if allowed {
		earliest = min(earliest, expiry)
	}
	return int64(len(e)), earliest, allowed, changed
}

// Release applies a Release of id at t under p: it drops the leases
// expired by t, then drops id and reports whether it was held. changed
// reports whether the set changed.
func (s *LeaseSet) Release(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (held bool, d throttler.Decision, changed bool) {
	held, used, earliest, changed := s.Drop(id, t)
	return held, LeaseDecision(p, used, earliest, t, used < p.Limit), changed
}

// Drop is Release without building its Decision, as Hold is Acquire's.
func (s *LeaseSet) Drop(id throttler.LeaseID, t int64) (held bool, used, earliest int64, changed bool) {
	e := *s
	n := 0
	earliest = math.MaxInt64
	for i := range e {
		x := e[i]
		if x.Expiry <= t {
			continue
		}
		if x.ID == id {
			held = true
			continue
		}
		earliest = min(earliest, x.Expiry)
		if n != i {
			e[n] = x
		}
		n++
	}
	changed = n != len(e)
	clear(e[n:]) // no stale entries behind the length
	*s = e[:n]
	return held, int64(n), earliest, changed
}

// End is when the set stops mattering, in Unix ms: its latest expiry, from
// which on it answers like no state at all (so a backend may drop it);
// math.MinInt64 for an empty set, which answers like none at any instant.
func (s LeaseSet) End() int64 {
	end := int64(math.MinInt64)
	for _, l := range s {
		end = max(end, l.Expiry)
	}
	return end
}

// LeaseDecision is the lease contract's Decision at t (Unix ms) with used
// leases held after the call, the earliest of them expiring at earliest
// (unused when none is held: ResetAt is then t + TTL). RetryAfter is
// ResetAt - t whenever Allowed is false, after a Release too (as after a
// Peek), so that every Decision reads alike.
func LeaseDecision(p throttler.ConcurrencyPolicy, used, earliest, t int64, allowed bool) (d throttler.Decision) {
	if used == 0 {
		earliest = t + p.TTL.Milliseconds()
	}
	d.Allowed, d.Limit, d.Used, d.Remaining = allowed, p.Limit, used, max(0, p.Limit-used)
	d.ResetAt = time.UnixMilli(earliest)
	if !allowed {
		d.RetryAfter = time.Duration(earliest-t) * time.Millisecond
	}
	return d
}

// LeaseIdentity returns the name under which a backend stores the leases of
// p: with the key, the storage identity of a concurrency limit.
//
//   - A named policy's is "<name> cc": (Name, key) alone, so a live
//     policy's Limit and TTL can change without dropping the leases held,
//     and never a rate Policy's identity (Identity), since no Name holds a
//     space and no rate algorithm's tag is "cc".
//   - An unnamed policy's is its whole definition, " cc <limit>/<ttl ms>",
//     as the lease contract says: Concurrent(5, time.Minute) and
//     Concurrent(5, time.Hour) on one key are two limits, as PerMinute and
//     PerHour are. Name a policy to keep its leases across a change of TTL.
func LeaseIdentity(p throttler.ConcurrencyPolicy) string {
	return string(AppendLeaseIdentity(make([]byte, 0, 32), p))
}

// AppendLeaseIdentity appends LeaseIdentity(p) to dst, for backends that
// build a storage key without an allocation of its own.
func AppendLeaseIdentity(dst []byte, p throttler.ConcurrencyPolicy) []byte {
	if p.Name != "" {
		dst = append(dst, p.Name...)
		return append(dst, " cc"...)
	}
	dst = append(dst, " cc "...)
	dst = strconv.AppendInt(dst, p.Limit, 10)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, p.TTL.Milliseconds(), 10)
}

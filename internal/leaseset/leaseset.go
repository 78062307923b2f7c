// Package leaseset is the lease contract's arithmetic (throttler.LeaseBackend's
// doc, pinned to the millisecond) for the backends written in Go (memory,
// Memcached); the Redis scripts compute the same in Lua. A Set is one
// key's state; its methods take the call's instant t in Unix ms (now
// truncated) and answer with the contract's Decision. Inputs must have
// passed throttler.ValidateLease.
package leaseset

import (
	"math"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Entry is one held lease: its ID and its expiry in Unix ms. It is not
// held at an instant t >= Expiry.
type Entry struct {
	ID     throttler.LeaseID
	Expiry int64
}

// Set is the leases stored for one (policy, key), in no particular
// order, each ID at most once. A Memcached backend converts its decoded
// entries (Set(entries)) and encodes the set after a call that
// changed it; the memory backend keeps one per key and reuses its array,
// so that a steady Acquire and Release allocate nothing. The zero value
// (nil) holds nothing. Each call costs one pass over the entries (at most
// throttler.MaxConcurrencyLimit plus those expired since the last call).
type Set []Entry

// Acquire applies an Acquire of id at t under p: it drops the leases
// expired by t, then holds id until t + TTL if it is held already (a
// refresh, counted once) or fewer than p.Limit are held. changed reports
// whether the set changed (a drop, a lease taken or refreshed): the state
// to write.
func (s *Set) Acquire(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (d throttler.Decision, changed bool) {
	used, earliest, allowed, changed := s.Hold(p, id, t)
	return Decision(p, used, earliest, t, allowed), changed
}

// Hold is Acquire without building its Decision: the leases held after the
// call, the earliest expiry among them, and whether id was admitted
// (Decision makes the Decision of them). Hot paths call it to build
// the Decision once, outside their lock.
func (s *Set) Hold(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (used, earliest int64, allowed, changed bool) {
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
		e = append(e, Entry{ID: id, Expiry: expiry})
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
func (s *Set) Release(p throttler.ConcurrencyPolicy, id throttler.LeaseID, t int64) (held bool, d throttler.Decision, changed bool) {
	held, used, earliest, changed := s.Drop(id, t)
	return held, Decision(p, used, earliest, t, used < p.Limit), changed
}

// Drop is Release without building its Decision, as Hold is Acquire's.
func (s *Set) Drop(id throttler.LeaseID, t int64) (held bool, used, earliest int64, changed bool) {
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
func (s Set) End() int64 {
	end := int64(math.MinInt64)
	for _, l := range s {
		end = max(end, l.Expiry)
	}
	return end
}

// Decision is the lease contract's Decision at t (Unix ms) with used
// leases held after the call, the earliest of them expiring at earliest
// (unused when none is held: ResetAt is then t + TTL). RetryAfter is
// ResetAt - t whenever Allowed is false, after a Release too (as after a
// Peek), so that every Decision reads alike.
func Decision(p throttler.ConcurrencyPolicy, used, earliest, t int64, allowed bool) (d throttler.Decision) {
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

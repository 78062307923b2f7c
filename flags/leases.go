package flags

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Leases through a Router.
//
// A Router holds leases when both its backends do (Traits; a Throttler
// over it then reports SupportsLeases). An Acquire goes where the rollout
// sends the key, as a Take does; a Release must reach the backend that
// granted the lease, even if the rollout moved the key in between, or the
// lease would count there until its TTL. So the router remembers, per held
// lease (key, policy identity and LeaseID), which backend granted it, in a
// bounded table: an entry goes at the Release, or once its lease has
// expired (swept by later Acquires), and a lease the table does not know
// (granted while it was full, or expired and swept) is released to both
// backends, which is harmless: Release is idempotent and a LeaseID is
// random, so the other backend never holds it.

// leaseShards spreads the table's lock: lease IDs are random, so the
// shards fill evenly.
const leaseShards = 16

// sweepEvery is the least time, on the calls' clock, between two sweeps of
// a shard that is not full: expired entries go within it.
const sweepEvery = int64(time.Second / time.Millisecond)

// routerLeases is a Router's lease state; old and new are nil unless both
// backends hold leases.
type routerLeases struct {
	old, new throttler.LeaseBackend
	shards   [leaseShards]leaseShard
	perShard int

	oldAcquires, newAcquires, oldReleases, newReleases atomic.Uint64
	unknown, untracked                                 atomic.Uint64
}

// leaseRef names one held lease: its key, its policy's storage identity
// (the Name of a named policy; the definition of an unnamed one) and its ID.
type leaseRef struct {
	key, name  string
	limit, ttl int64 // zero for a named policy
	id         throttler.LeaseID
}

func refOf(key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID) leaseRef {
	r := leaseRef{key: key, name: p.Name, id: id}
	if p.Name == "" {
		r.limit, r.ttl = p.Limit, int64(p.TTL)
	}
	return r
}

// grant is who granted a lease, and until when (Unix ms) it holds.
type grant struct {
	isNew   bool
	expires int64
}

type leaseShard struct {
	mu sync.Mutex
	m  map[leaseRef]grant
	// earliest is at or before every entry's expiry: no sweep frees
	// anything before it. swept is when the last sweep ran.
	earliest, swept int64
	_               [64]byte
}

func (r *Router) initLeases(maxLeases int) {
	l := &r.leases
	if !r.oldTraits.Leases || !r.newTraits.Leases {
		return
	}
	l.old, l.new = r.old.(throttler.LeaseBackend), r.new.(throttler.LeaseBackend)
	l.perShard = max(1, maxLeases/leaseShards)
	for i := range l.shards {
		l.shards[i].m = make(map[leaseRef]grant)
	}
}

// A Router over a backend without leases has the lease methods, but says so
// in its Traits and answers them with throttler.ErrLeasesUnsupported.
var _ throttler.LeaseBackend = (*Router)(nil)

// Acquire takes lease id on key under p from the backend the rollout (or
// the strategy) sends the key to, and remembers which one granted it. A
// lease the router knows to be held already (a retried Acquire) is renewed
// where it was granted, unless the strategy sends the key to both
// backends: a lease granted there is not remembered. The router does not
// validate: the backend does.
func (r *Router) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	l := &r.leases
	if l.old == nil {
		return throttler.Decision{}, r.noLeases()
	}
	// The strategy's one reading decides both whether the key is moving
	// and its route: read again, a change in between could send a key that
	// moved to its new backend alone.
	var isNew, routed bool
	if r.strategy != nil {
		var moving bool
		var both throttler.LeaseBackend
		if isNew, moving, both = r.strategy.RouteLease(key, p); moving {
			r.count(isNew)
			d, err := both.Acquire(ctx, key, p, id, now)
			if err != nil {
				return d, r.wrap(err, isNew)
			}
			return d, nil
		}
		routed = true
	}
	ref := refOf(key, p, id)
	sh := &l.shards[uint64(id)%leaseShards]
	ms := now.UnixMilli()
	sh.mu.Lock()
	g, known := sh.m[ref]
	sh.mu.Unlock()
	if known && g.expires > ms {
		isNew = g.isNew
	} else if !routed {
		isNew = r.rollout.UseNew(key)
	}
	d, err := r.leaseSide(isNew, &l.oldAcquires, &l.newAcquires).Acquire(ctx, key, p, id, now)
	if err != nil {
		return d, r.wrap(err, isNew)
	}
	if d.Allowed {
		l.remember(sh, ref, grant{isNew: isNew, expires: ms + p.TTL.Milliseconds()}, ms)
	} else if known {
		sh.mu.Lock()
		delete(sh.m, ref) // a denied Acquire holds nothing
		sh.mu.Unlock()
	}
	return d, nil
}

// remember records g for ref, sweeping the shard's expired entries first
// when it is due; a shard still full leaves the lease untracked.
func (l *routerLeases) remember(sh *leaseShard, ref leaseRef, g grant, ms int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	full := len(sh.m) >= l.perShard
	if ms >= sh.earliest && (full || ms-sh.swept >= sweepEvery) {
		sh.sweep(ms)
		full = len(sh.m) >= l.perShard
	}
	if _, held := sh.m[ref]; full && !held {
		l.untracked.Add(1)
		return
	}
	sh.m[ref] = g
	if len(sh.m) == 1 || g.expires < sh.earliest {
		sh.earliest = g.expires
	}
}

// sweep drops the entries whose lease has expired at ms. sh.mu is held.
func (sh *leaseShard) sweep(ms int64) {
	earliest := int64(1<<63 - 1)
	for ref, g := range sh.m {
		if g.expires <= ms {
			delete(sh.m, ref)
		} else {
			earliest = min(earliest, g.expires)
		}
	}
	sh.earliest, sh.swept = earliest, ms
}

// Release gives lease id back to the backend that granted it, and forgets
// it. A lease the router does not know (granted while its table was full,
// expired and swept, released already, granted on both backends by the
// strategy, or never granted through it) goes to the strategy's both
// backend when it names one; otherwise it is released to both backends:
// held is then whether either held it, and the Decision that one's, or,
// when neither did, the one of the backend the key is routed to now. The
// router does not validate: the backends do.
func (r *Router) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	l := &r.leases
	if l.old == nil {
		return false, throttler.Decision{}, r.noLeases()
	}
	ref := refOf(key, p, id)
	sh := &l.shards[uint64(id)%leaseShards]
	sh.mu.Lock()
	g, known := sh.m[ref]
	delete(sh.m, ref)
	sh.mu.Unlock()
	if known {
		return r.releaseTo(ctx, g.isNew, key, p, id, now)
	}
	var first bool
	if r.strategy != nil {
		var both throttler.LeaseBackend
		if first, _, both = r.strategy.RouteLease(key, p); both != nil {
			r.count(first)
			held, d, err := both.Release(ctx, key, p, id, now)
			if err != nil {
				return held, d, r.wrap(err, first)
			}
			return held, d, nil
		}
	} else {
		first = r.rollout.UseNew(key)
	}
	l.unknown.Add(1)
	held, d, err := r.releaseTo(ctx, first, key, p, id, now)
	if held || throttler.IsInputError(err) {
		return held, d, err
	}
	oheld, od, oerr := r.releaseTo(ctx, !first, key, p, id, now)
	switch {
	case oheld:
		return true, od, nil
	case err != nil || oerr != nil:
		return false, throttler.Decision{}, errors.Join(err, oerr)
	}
	return false, d, nil
}

// releaseTo releases on one backend, counting the call.
func (r *Router) releaseTo(ctx context.Context, isNew bool, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	l := &r.leases
	held, d, err := r.leaseSide(isNew, &l.oldReleases, &l.newReleases).Release(ctx, key, p, id, now)
	if err != nil {
		return held, d, r.wrap(err, isNew)
	}
	return held, d, nil
}

// leaseSide returns the old or the new backend's leases, counting the call
// among the backend's calls and in its counter of the operation's.
func (r *Router) leaseSide(isNew bool, oldOps, newOps *atomic.Uint64) throttler.LeaseBackend {
	r.count(isNew)
	if isNew {
		newOps.Add(1)
		return r.leases.new
	}
	oldOps.Add(1)
	return r.leases.old
}

// count counts a lease call among the backend's calls.
func (r *Router) count(isNew bool) {
	if isNew {
		r.newCalls.Add(1)
	} else {
		r.oldCalls.Add(1)
	}
}

// noLeases is the error of a lease call on a Router whose backends do not
// both hold leases.
func (r *Router) noLeases() error {
	name, b := r.oldName, r.old
	if r.oldTraits.Leases {
		name, b = r.newName, r.new
	}
	return fmt.Errorf("%w: the router's %s backend (%T)", throttler.ErrLeasesUnsupported, name, b)
}

// leaseStats fills in s.Leases.
func (r *Router) leaseStats(s *Stats) {
	l := &r.leases
	ls := &s.Leases
	ls.OldAcquires, ls.NewAcquires = l.oldAcquires.Load(), l.newAcquires.Load()
	ls.OldReleases, ls.NewReleases = l.oldReleases.Load(), l.newReleases.Load()
	ls.Unknown, ls.Untracked = l.unknown.Load(), l.untracked.Load()
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		ls.Held += len(sh.m)
		sh.mu.Unlock()
	}
}

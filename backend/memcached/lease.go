package memcached

import (
	"context"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// Leases (throttler.LeaseBackend: concurrency limits).
//
// Each (concurrency policy, key) pair is one item, <prefix> "l:" <id>,
// where <id> encodes identity.Lease(p) and the key as for every
// other item (keys.go); the kind "l:" keeps it apart from the items of a
// rate policy of the same name. It holds the leases held (lease_state.go).
// Acquire and Release are one read-modify-write of it, the loop of the
// state items (update): gets, the lease contract's arithmetic at now
// (leaseset.Set), then cas over the version read, or add when there
// was none. Losing to another process starts again, at most MaxAttempts
// rounds for an Acquire and releaseAttemptsFactor times as many for a
// Release (below), then ErrContention, having changed nothing: the
// Throttler's failure mode answers it like an outage of the key's server.
// A call that changes nothing (a denied Acquire, a Release of a lease not
// held, with no lease expired since the last write) is one round trip
// (gets); one that changes the leases is two.
//
// The item expires with its latest lease (plus the margin, rounded up to
// seconds, and not at all beyond 30 days: the rule of every item), for
// cleanup only: a lease stops counting at its expiry by the caller's now,
// whether or not Memcached has dropped the item yet. When the last lease
// is released the item is written empty rather than deleted, since delete
// takes no CAS and could drop a lease acquired in between; it expires
// seconds later.
//
// What Memcached cannot promise: it may evict a live item under memory
// pressure, which frees every lease of the pair at once (up to Limit more
// can then run until the earlier ones end), and with several servers each
// pair depends on the one its item lives on.

var _ throttler.LeaseBackend = (*Backend)(nil)

// releaseAttemptsFactor is how many times MaxAttempts a Release may make
// rounds. A Release that runs out leaves its lease held for its whole TTL,
// taking a slot from every caller of the key, where an Acquire that runs
// out costs its one request; so a Release keeps trying longer, with the
// same jittered backoff, within the caller's context (a Throttler bounds it
// by its Timeout). With 8 processes on one key, about 1 call in 200 lost
// all of 8 rounds; 32 make that vanishingly rare (docs/performance.md,
// "Leases on Memcached").
const releaseAttemptsFactor = 4

// leases is the item holding the pair's leases.
func (k itemKeys) leases() string { return k.prefix + "l:" + k.id }

// leaseKeys names the items of the lease pair (p, key).
func (b *Backend) leaseKeys(key string, p throttler.ConcurrencyPolicy) itemKeys {
	return identityKeys(b.opts.Prefix, identity.Lease(p), key)
}

// Acquire takes the lease id on key under p if fewer than p.Limit leases
// are held, or refreshes it if it is held already.
func (b *Backend) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	var d throttler.Decision
	err := b.leaseCall(ctx, key, p, id, b.opts.MaxAttempts, now, func(set *leaseset.Set, t int64) bool {
		var changed bool
		d, changed = set.Acquire(p, id, t)
		return changed
	})
	if err != nil {
		return throttler.Decision{}, err
	}
	return d, nil
}

// Release drops the lease id of key under p and reports whether it was
// held; releasing a lease that expired, was released already or never
// existed changes nothing.
func (b *Backend) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	var held bool
	var d throttler.Decision
	err := b.leaseCall(ctx, key, p, id, b.releaseAttempts(), now, func(set *leaseset.Set, t int64) bool {
		var changed bool
		held, d, changed = set.Release(p, id, t)
		return changed
	})
	if err != nil {
		return false, throttler.Decision{}, err
	}
	return held, d, nil
}

// releaseAttempts bounds a Release's rounds (see releaseAttemptsFactor).
func (b *Backend) releaseAttempts() int { return releaseAttemptsFactor * b.opts.MaxAttempts }

// leaseCall validates a lease operation and runs op, which applies it to
// the decoded leases at t (Unix ms) and reports whether they changed, as
// one read-modify-write of the pair's item, in at most attempts rounds.
func (b *Backend) leaseCall(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, attempts int, now time.Time, op func(set *leaseset.Set, t int64) bool) error {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return err
	}
	k := b.leaseKeys(key, p)
	t := now.UnixMilli()
	err := b.update(ctx, k.leases(), k.id, "leases", attempts, now, nil, func(it *memcache.Item) ([]byte, int64, bool, error) {
		var set leaseset.Set
		if it != nil {
			entries, err := decodeLeases(it.Value)
			if err != nil {
				return nil, 0, false, err
			}
			set = entries
		}
		if !op(&set, t) {
			return nil, 0, false, nil
		}
		value := appendLeases(make([]byte, 0, 16+13*len(set)), set)
		return value, max(set.End(), t), true, nil
	})
	if err != nil {
		return b.classifyAt(func() string { return k.leases() }, err)
	}
	return nil
}

// leaseStore names the server that holds key's leases under p (see store),
// or "" when the backend cannot see the servers.
func (b *Backend) leaseStore(key string, p throttler.ConcurrencyPolicy) string {
	if b.servers == nil {
		return ""
	}
	return b.serverOf(b.leaseKeys(key, p).leases())
}

package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// Leases (throttler.LeaseBackend), Stripe's concurrent-requests limiter:
// a (policy, key)'s leases are one sorted set, each lease a member named by
// its ID and scored by its expiry, in the layout of keys.go under
// identity.Lease and marked as the algorithms' keys are (the
// identity, "<name> cc" or " cc <limit>/<ttl ms>", never meets a rate
// policy's). Acquire and Release are one script each (acquire.lua,
// release.lua), one round trip on the key's shard's primary: both write
// (they drop expired leases), so a replica never serves them. One key per
// call keeps a Cluster's call in one slot.

var (
	//go:embed scripts/acquire.lua
	acquireSource string
	acquireScript = goredis.NewScript(acquireSource)
	//go:embed scripts/release.lua
	releaseSource string
	releaseScript = goredis.NewScript(releaseSource)
)

var _ throttler.LeaseBackend = (*Backend)(nil)

// maxLeaseInstant bounds the instants the scripts take: scores are doubles,
// exact up to 2^53 ms (285,000 years from 1970), so an expiry beyond it
// would be rounded. Calls outside it are input errors.
const maxLeaseInstant = 1 << 53

// Acquire takes a lease of id on key under p, by the lease contract: one
// script, one round trip, on the shard's primary.
func (b *Backend) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	t, err := leaseCall(key, p, id, now)
	if err != nil {
		return throttler.Decision{}, err
	}
	sk, h := b.leaseKey(p, key)
	var res [3]int64
	err = parseInts(b.shardFor(h).runSettled(ctx, acquireScript, []string{sk},
		t, strconv.FormatUint(uint64(id), 10), t+p.TTL.Milliseconds(), p.Limit, b.marginMS), res[:])
	if err == nil {
		err = checkLeaseReply(res, t, true)
	}
	if err != nil {
		return throttler.Decision{}, opError("acquire", key, p, err)
	}
	return leaseset.Decision(p, res[1], res[2], t, res[0] == 1), nil
}

// Release gives back the lease of id on key under p, by the lease
// contract: one script, one round trip, on the shard's primary.
func (b *Backend) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	t, err := leaseCall(key, p, id, now)
	if err != nil {
		return false, throttler.Decision{}, err
	}
	sk, h := b.leaseKey(p, key)
	var res [3]int64
	err = parseInts(b.shardFor(h).runSettled(ctx, releaseScript, []string{sk},
		t, strconv.FormatUint(uint64(id), 10)), res[:])
	if err == nil {
		err = checkLeaseReply(res, t, false)
	}
	if err != nil {
		return false, throttler.Decision{}, opError("release", key, p, err)
	}
	return res[0] == 1, leaseset.Decision(p, res[1], res[2], t, res[1] < p.Limit), nil
}

// leaseCall validates a lease call and returns its instant in Unix ms.
func leaseCall(key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (int64, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return 0, err
	}
	t := now.UnixMilli()
	if t <= -maxLeaseInstant || t+p.TTL.Milliseconds() >= maxLeaseInstant {
		return 0, fmt.Errorf("%w: redis holds lease expiries within ±2^53 ms of 1970, got now %v and TTL %v",
			throttler.ErrInvalidPolicy, now, p.TTL)
	}
	return t, nil
}

// leaseKey is the storage key of p's leases on key, and its hash.
func (b *Backend) leaseKey(p throttler.ConcurrencyPolicy, key string) (string, uint64) {
	var idBuf [maxPolicyNameLen + 3]byte
	return b.identityKey(identity.AppendLease(idBuf[:0], p), key, algorithmMarker)
}

// leaseStore names the shard that holds p's leases on key, as store does
// for a rate policy: a Throttler's breaker for lease calls.
func (b *Backend) leaseStore(key string, p throttler.ConcurrencyPolicy) string {
	if len(b.shards) == 1 && b.shards[0].cluster == nil {
		return b.shards[0].name
	}
	var idBuf [maxPolicyNameLen + 3]byte
	var lenBuf [20]byte
	_, h := b.identityHash(identity.AppendLease(idBuf[:0], p), key, lenBuf[:0])
	s := b.shardFor(h)
	if s.cluster != nil {
		return s.cluster.store(hashSlot(h, b.tagByKey))
	}
	return s.name
}

// checkLeaseReply checks a lease script's {flag, used, earliest}: a flag
// of 0 or 1, no negative count, an earliest expiry after t exactly when a
// lease is held, and none after an admitted Acquire (acquired).
func checkLeaseReply(res [3]int64, t int64, acquired bool) error {
	bad := res[0] < 0 || res[0] > 1 || res[1] < 0 ||
		(res[1] > 0 && res[2] <= t) || (res[1] == 0 && res[2] != 0) ||
		(acquired && res[0] == 1 && res[1] == 0)
	if bad {
		return fmt.Errorf("%w: %v", ErrUnexpectedReply, res)
	}
	return nil
}

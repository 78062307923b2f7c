package redis

import (
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// The over-limit cache (Options.OverLimitCache, docs/backends-redis.md):
// envoy's idea. A Take that Redis denied tells until when the key stays
// denied to any Take at least as large, unless a unit comes back: a fixed
// window until its ResetAt, a bucket, a counter or a log until its
// RetryAfter. Until then, further Takes of that (policy, key) in this
// process are answered here, from what Redis replied, without a round
// trip:
//
//   - fixed window: denied while cost > Limit - Used; the Decision is
//     WindowState's, as Redis would give it from the same window;
//   - token bucket and sliding-window counter: the state the script read
//     is kept, and algo.TokenBucket or algo.Counter answers from it at the
//     call's now, exactly what the script would from that state; only a
//     denial is answered here;
//   - sliding log: only a denial that waits for one unit to end (Used +
//     cost = Limit + 1, a hot key's), until that unit ends; a Take of the
//     same cost at or after the denial's instant gets its Decision with
//     RetryAfter counting down: no unit ends meanwhile, so Used, Remaining
//     and ResetAt are what Redis would answer.
//
// An entry is dropped at its instant, by a Take of this process that Redis
// admitted, by any Refund of this process, and by a call with another
// definition of the policy (a Limit changed live). It differs from Redis
// when another process refunds units, or Redis's state is changed or lost
// otherwise (a key deleted, a failover losing writes), or a policy's Limit
// is raised in another process only: then this process keeps denying until
// the entry's instant. Used may also lag other processes' Takes.

// cacheShards spreads the cache's keys over locks.
const cacheShards = 32

type overLimitCache struct {
	perShard int
	shards   [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[string]*overLimit
	_  [40]byte // a cache line each
}

// overLimit is one denial.
type overLimit struct {
	p     throttler.Policy
	at    int64 // Unix ms of the denial
	until int64 // Unix ms on the callers' clock: no longer denied from then
	cost  int64
	d     throttler.Decision
	// a bucket's or a counter's state as the script read it
	bucket  algo.TokenBucketState
	counter algo.CounterState
	stored  bool
}

func newOverLimitCache(n int) *overLimitCache {
	c := &overLimitCache{perShard: max(1, (n+cacheShards-1)/cacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*overLimit)
	}
	return c
}

func (c *overLimitCache) shard(h uint64) *cacheShard { return &c.shards[h%cacheShards] }

// take answers a Take of cost at t from a denial, if one still holds.
func (c *overLimitCache) take(sk string, h uint64, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, bool) {
	s := c.shard(h)
	s.mu.Lock()
	e := s.m[sk]
	if e == nil {
		s.mu.Unlock()
		return throttler.Decision{}, false
	}
	t := now.UnixMilli()
	if e.p != p || t >= e.until {
		delete(s.m, sk)
		s.mu.Unlock()
		return throttler.Decision{}, false
	}
	e2 := *e
	s.mu.Unlock()
	return e2.answer(cost, now, t)
}

func (e *overLimit) answer(cost int64, now time.Time, t int64) (throttler.Decision, bool) {
	switch e.p.Algorithm {
	case throttler.FixedWindow:
		if cost <= e.p.Limit-e.d.Used {
			return throttler.Decision{}, false
		}
		return algo.WindowState(e.p, e.d.Used, e.d.ResetAt, now, false), true
	case throttler.TokenBucket:
		d, _, write := algo.TokenBucket(e.p, e.bucket, e.stored, throttler.OpTake, cost, 0, t)
		return d, !write
	case throttler.SlidingWindow:
		d, _, write := algo.Counter(e.p, e.counter, e.stored, throttler.OpTake, cost, 0, t)
		return d, !write
	case throttler.SlidingLog:
		if cost != e.cost || t < e.at {
			return throttler.Decision{}, false
		}
		d := e.d
		d.RetryAfter = time.Duration(e.until-t) * time.Millisecond
		return d, true
	}
	return throttler.Decision{}, false
}

// put records a denial; when the shard is full it first drops the entries
// that ended by now, then, if none did, one at random.
func (c *overLimitCache) put(sk string, h uint64, e *overLimit, now int64) {
	if e.until <= now {
		return
	}
	s := c.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[sk]; !ok && len(s.m) >= c.perShard {
		for k, old := range s.m {
			if old.until <= now {
				delete(s.m, k)
			}
		}
		for k := range s.m {
			if len(s.m) < c.perShard {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[sk] = e
}

// drop forgets a key: a Take admitted or a Refund made by this process.
func (c *overLimitCache) drop(sk string, h uint64) {
	s := c.shard(h)
	s.mu.Lock()
	if len(s.m) > 0 {
		delete(s.m, sk)
	}
	s.mu.Unlock()
}

func (c *overLimitCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

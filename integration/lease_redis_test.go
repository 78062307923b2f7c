package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// failOpen and failClosed name the values of throttler.Options.FailClosed.
const failOpen, failClosed = false, true

// leaseRedisSetups are the layouts the lease tests run on: one server, and
// a Cluster of three masters. newClient returns a client of its own (its
// own connections, as another process would have) each call.
func leaseRedisSetups(t *testing.T) []struct {
	name      string
	newClient func(t *testing.T) redis.Client
} {
	rc := redisStart(t)
	addrs := redisCluster(t, 3)
	return []struct {
		name      string
		newClient func(t *testing.T) redis.Client
	}{
		{"standalone", func(t *testing.T) redis.Client { return redisClient(t, rc.Addr) }},
		{"cluster", func(t *testing.T) redis.Client { return redisClusterClient(t, addrs) }},
	}
}

// TestLeaseRedis runs the lease suite and the exactness test on a real
// Redis and on a real Cluster.
func TestLeaseRedis(t *testing.T) {
	for _, s := range leaseRedisSetups(t) {
		t.Run(s.name+"/Conformance", func(t *testing.T) {
			if testing.Short() {
				t.Skip("the suite runs on a local redis-server in backend/redis")
			}
			backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore { return redisNew(t, s.newClient(t), nil) })
		})
		t.Run(s.name+"/Exactness", func(t *testing.T) { leaseRedisExactness(t, s.newClient) })
		t.Run(s.name+"/CrashedClient", func(t *testing.T) { leaseRedisCrashedClient(t, s.newClient) })
	}
}

// leaseRedisExactness: leaseExactness on 4 clients of their own.
func leaseRedisExactness(t *testing.T, newClient func(t *testing.T) redis.Client) {
	backends := make([]throttler.LeaseBackend, 4)
	for i := range backends {
		backends[i] = redisNew(t, newClient(t), nil)
	}
	leaseExactness(t, backends, fmt.Sprint("exact-", time.Now().UnixNano()), 20*time.Millisecond, nil)
}

// leaseRedisCrashedClient: a client that acquires every slot and dies
// without releasing holds them until their TTL, to the millisecond by the
// callers' clock (the test's own, passed as now), and not a moment longer;
// Redis then deletes the key by itself, TTL plus the margin later in real
// time.
func leaseRedisCrashedClient(t *testing.T, newClient func(t *testing.T) redis.Client) {
	p := throttler.ConcurrencyPolicy{Name: "crash", Limit: 5, TTL: 500 * time.Millisecond}
	ctx := context.Background()
	key := fmt.Sprint("crash-", time.Now().UnixNano())
	start := time.Now().Truncate(time.Millisecond)
	margin := 200 * time.Millisecond

	crashed := newClient(t)
	var gone time.Time
	leaseCrashedClient(t, redisNew(t, crashed, &redis.Options{ExpiryMargin: margin}), redisNew(t, newClient(t), &redis.Options{ExpiryMargin: margin}),
		func() error { err := crashed.(interface{ Close() error }).Close(); gone = time.Now(); return err }, key, p, start)
	// Cleanup is Redis's, in real time: the key outlives its latest lease
	// by the margin, then goes. (The leases above were taken at instants
	// up to TTL ahead of the real clock, so allow for that too.)
	probe := newClient(t)
	n, err := leaseRedisKeys(ctx, probe, "throttlekit:*"+key)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the leases' key")
	waitFor(t, 10*time.Second, "the crashed client's key to expire", func(ctx context.Context) bool {
		n, err := leaseRedisKeys(ctx, probe, "throttlekit:*"+key)
		return err == nil && n == 0
	})
	assert.GreaterOrEqual(t, time.Since(gone), p.TTL, "not before the leases' TTL")
}

// leaseFaultMargin is what a call may take beyond the Throttler's Timeout
// while Redis is paused: with 16 goroutines under -race on 2 cores that
// other tests share, scheduling alone has taken 400 ms. A call that waited
// for the paused server would take go-redis's ReadTimeout, 3 s.
const leaseFaultMargin = time.Second

// TestLeaseRedisPaused: Redis paused mid-load, under a Throttler on the
// test's own clock. Every call returns within the Throttler's Timeout
// (plus scheduling); no call made while Redis is paused is answered by it:
// each fails with the store's error or is answered by the failure mode
// (Degraded; never allowed under FailClosed), as Options.FailClosed says. The
// leases Redis granted are never more than Limit, before, during and after
// the pause; those whose Release failed during it count until their TTL by
// the callers' clock, and not a moment longer.
func TestLeaseRedisPaused(t *testing.T) {
	rc := redisStart(t)
	b := redisNew(t, redisClient(t, rc.Addr), nil)
	p := throttler.ConcurrencyPolicy{Name: "paused", Limit: 8, TTL: time.Minute}
	for _, mode := range []bool{failOpen, failClosed} {
		name := map[bool]string{failOpen: "fail-open", failClosed: "fail-closed"}[mode]
		t.Run(name, func(t *testing.T) {
			key := fmt.Sprint("paused-", time.Now().UnixNano())
			var clock atomic.Int64 // the test's clock, Unix ms: fixed while the load runs
			clock.Store(backendtest.T0.UnixMilli())
			th, err := throttler.New(b, &throttler.Options{
				Timeout: redisFaultTimeout, FailClosed: mode,
				Clock: func() time.Time { return time.UnixMilli(clock.Load()) },
			})
			require.NoError(t, err)
			ctx := context.Background()
			const (
				running = iota
				paused
				resuming
			)
			var phase atomic.Int32
			var held atomic.Int64
			var stop atomic.Bool
			type tally struct{ granted, denied, failed, degraded atomic.Int64 }
			var slowest atomic.Int64
			var tallies [3]tally
			var wg sync.WaitGroup
			defer func() { stop.Store(true); wg.Wait() }() // also when a check below fails
			for range 16 {
				wg.Go(func() {
					for !stop.Load() {
						before := phase.Load()
						start := time.Now()
						l, d, err := th.Acquire(ctx, key, p)
						took := time.Since(start)
						after := phase.Load()
						// Attribute the call to a phase only if it ran
						// wholly inside it.
						var tl *tally
						if before == after {
							tl = &tallies[before]
						} else {
							tl = new(tally)
						}
						for m := slowest.Load(); int64(took) > m && !slowest.CompareAndSwap(m, int64(took)); m = slowest.Load() {
						}
						if took > redisFaultTimeout+leaseFaultMargin {
							t.Errorf("Acquire took %v: it waited for the paused server", took)
						}
						switch {
						case err != nil:
							tl.failed.Add(1)
						case d.Degraded:
							tl.degraded.Add(1)
							if mode == failClosed && d.Allowed {
								t.Errorf("FailClosed allowed an Acquire Redis did not answer")
							}
						case d.Allowed:
							tl.granted.Add(1)
							if n := held.Add(1); n > p.Limit || d.Used > p.Limit {
								t.Errorf("%d leases held by the test, Redis says %d: more than Limit %d", n, d.Used, p.Limit)
							}
							time.Sleep(5 * time.Millisecond) // the request's work
							held.Add(-1)
						default:
							tl.denied.Add(1)
						}
						// Fails while paused: that lease counts until its
						// TTL.
						_, _, _ = l.Release(ctx)
						if !d.Allowed || d.Degraded {
							// A client not admitted waits a little
							// before it asks again. Without it, 16
							// callers answered at once (the breaker
							// open) spun through ~2M calls, and on a
							// loaded machine a call that did no I/O at
							// all took 375 ms to return.
							time.Sleep(time.Millisecond)
						}
					}
				})
			}
			time.Sleep(300 * time.Millisecond) // load on a healthy Redis
			redisPause(t, rc)
			phase.Store(paused)
			time.Sleep(time.Second)
			phase.Store(resuming)
			redisUnpause(t, rc)
			// Back: Redis answers again (it may deny everything, for the
			// leases whose Release failed during the pause still count).
			// Under load a resumed Redis first works through what queued
			// while it was paused, and each probe that misses the 100 ms
			// Timeout costs the breaker another cooldown: a fresh-clone CI
			// run took over 10 s.
			waitFor(t, 30*time.Second, "Redis to answer again", func(context.Context) bool {
				return tallies[resuming].granted.Load()+tallies[resuming].denied.Load() > 20
			})
			stop.Store(true)
			wg.Wait()
			for i, name := range []string{"before", "during", "after"} {
				tl := &tallies[i]
				t.Logf("%s the pause: %d granted, %d denied, %d failed, %d degraded", name,
					tl.granted.Load(), tl.denied.Load(), tl.failed.Load(), tl.degraded.Load())
			}
			t.Logf("slowest call: %v", time.Duration(slowest.Load()))
			assert.Positive(t, tallies[running].granted.Load(), "Redis granted leases before the pause")
			during := &tallies[paused]
			assert.Positive(t, during.failed.Load()+during.degraded.Load(), "calls were made during the pause")
			assert.Zero(t, during.granted.Load()+during.denied.Load(), "a paused Redis answered")

			// Leases whose Release failed count until their TTL by the
			// callers' clock, and not a moment longer.
			now := time.UnixMilli(clock.Load())
			_, d, err := b.Release(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), now.Add(p.TTL-time.Millisecond))
			require.NoError(t, err)
			t.Logf("%d leases left by Releases that failed during the pause", d.Used)
			assert.LessOrEqual(t, d.Used, p.Limit)
			_, d, err = b.Release(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), now.Add(p.TTL))
			require.NoError(t, err)
			assert.Zero(t, d.Used, "every lease is released or has expired")
			clock.Store(now.Add(p.TTL).UnixMilli())
			l, d, err := th.Acquire(ctx, key, p)
			require.NoError(t, err)
			assert.True(t, d.Allowed && !d.Degraded, "Redis grants leases again: %+v", d)
			_, _, _ = l.Release(ctx)
		})
	}
}

// leaseRedisKeys counts the keys matching pattern, on every master of a
// Cluster.
func leaseRedisKeys(ctx context.Context, c redis.Client, pattern string) (int, error) {
	switch c := c.(type) {
	case *goredis.Client:
		keys, err := c.Keys(ctx, pattern).Result()
		return len(keys), err
	case *goredis.ClusterClient:
		var n atomic.Int64
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			keys, err := m.Keys(ctx, pattern).Result()
			n.Add(int64(len(keys)))
			return err
		})
		return int(n.Load()), err
	}
	return 0, fmt.Errorf("a %T", c)
}

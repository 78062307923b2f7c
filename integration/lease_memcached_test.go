package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestLeaseMemcachedExactness: 4 clients (own connections, as 4 processes
// would have) x 32 goroutines acquire and release leases on one key. The
// test counts the leases it holds, adding one after an admitted Acquire
// returns and taking it away before the Release is sent, so its count never
// exceeds what Memcached holds, and checks at every acquire that it is at
// most Limit. A call that runs out of rounds (ErrContention) is counted:
// a denied Acquire for the caller, and a Release the caller sends again,
// as the lease would otherwise hold its slot for the TTL.
func TestLeaseMemcachedExactness(t *testing.T) {
	const clients, goroutines, perGoroutine, work = 4, 32, 10, 200 * time.Millisecond
	s := memcachedStart(t)
	backends := memcachedBackends(t, clients, s.addr)
	p := throttler.ConcurrencyPolicy{Name: "exact", Limit: 20, TTL: time.Hour}
	ctx := context.Background()
	t0 := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	var held, peak, admitted, denied, contended, calls atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		for g := range goroutines {
			wg.Go(func() {
				b := backends[c]
				for i := range perGoroutine {
					now := t0.Add(time.Duration(g*perGoroutine+i) * time.Millisecond)
					id := throttler.NewLeaseID()
					calls.Add(1)
					d, err := b.Acquire(ctx, "hot", p, id, now)
					if errors.Is(err, memcached.ErrContention) {
						contended.Add(1)
						continue
					}
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					if !d.Allowed {
						denied.Add(1)
						continue
					}
					admitted.Add(1)
					n := held.Add(1)
					for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
					}
					if n > p.Limit || d.Used > p.Limit {
						t.Errorf("%d leases held by the test, Memcached says %d: more than Limit %d", n, d.Used, p.Limit)
					}
					// The request's work, long beside a call's queueing,
					// so that the test's count comes close to the store's.
					time.Sleep(work)
					held.Add(-1)
					for {
						calls.Add(1)
						ok, _, err := b.Release(ctx, "hot", p, id, now)
						if errors.Is(err, memcached.ErrContention) {
							contended.Add(1)
							continue
						}
						if err != nil || !ok {
							t.Errorf("Release: %v, %v; want held", ok, err)
						}
						break
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d calls: %d acquires admitted, %d denied, %d ErrContention (%.3f%% of calls), at most %d leases held at once",
		calls.Load(), admitted.Load(), denied.Load(), contended.Load(), 100*float64(contended.Load())/float64(calls.Load()), peak.Load())
	assert.Positive(t, denied.Load(), "the limit was reached")
	assert.Greater(t, peak.Load(), p.Limit/2, "the test's count came near Limit, so the check at every acquire had teeth")
	_, d, err := memcachedNew(t, memcachedClient(t, time.Second, s.addr), nil).Release(ctx, "hot", p, throttler.NewLeaseID(), t0.Add(time.Minute))
	require.NoError(t, err)
	assert.Zero(t, d.Used, "every lease was released")
}

// TestLeaseMemcachedCrashedClient: a client that acquires every slot and
// dies without releasing holds them until their TTL, to the millisecond by
// the callers' clock, and not a moment longer.
func TestLeaseMemcachedCrashedClient(t *testing.T) {
	s := memcachedStart(t)
	p := throttler.ConcurrencyPolicy{Name: "crash", Limit: 5, TTL: 30 * time.Second}
	ctx := context.Background()
	start := time.Now().Truncate(time.Millisecond)

	crashed := memcache.New(s.addr)
	crashed.Timeout = time.Second
	b := memcachedNew(t, crashed, nil)
	for i := range p.Limit {
		d, err := b.Acquire(ctx, "k", p, throttler.NewLeaseID(), start.Add(time.Duration(i)*time.Millisecond))
		require.NoError(t, err)
		require.True(t, d.Allowed, "lease %d", i)
	}
	require.NoError(t, crashed.Close()) // gone, its leases never released

	other := memcachedNew(t, memcachedClient(t, time.Second, s.addr), nil)
	firstEnd := start.Add(p.TTL)
	for _, tt := range []struct {
		at          time.Time
		wantAllowed bool
		wantUsed    int64
		wantRetry   time.Duration
	}{
		{start.Add(p.TTL / 2), false, 5, p.TTL / 2},
		{firstEnd.Add(-time.Millisecond), false, 5, time.Millisecond},
		{firstEnd, true, 5, 0},                           // the first expired: a new lease takes its slot
		{firstEnd.Add(time.Millisecond), true, 5, 0},     // and the second's
		{firstEnd.Add(4 * time.Millisecond), true, 3, 0}, // all five expired: the two new ones and this one
	} {
		d, err := other.Acquire(ctx, "k", p, throttler.NewLeaseID(), tt.at)
		require.NoError(t, err)
		at := tt.at.Sub(start)
		assert.Equal(t, tt.wantAllowed, d.Allowed, "at +%v", at)
		assert.Equal(t, tt.wantUsed, d.Used, "at +%v", at)
		assert.Equal(t, tt.wantRetry, d.RetryAfter, "at +%v", at)
	}
}

// TestLeaseMemcachedOneOfTwoServersPaused: with one of two servers paused,
// the leases of keys whose item lives on the healthy one are exact and
// never fail, and the calls of the paused one's keys fail as that server's
// failure (throttler.ErrUnavailable naming it), which a Throttler's breaker
// for that server alone counts.
func TestLeaseMemcachedOneOfTwoServersPaused(t *testing.T) {
	b, _, healthy, paused := memcachedTwoServers(t)
	p := throttler.ConcurrencyPolicy{Name: "two", Limit: 8, TTL: time.Hour}
	healthyStore, pausedStore := "memcached "+resolvedAddr(t, healthy.addr), "memcached "+resolvedAddr(t, paused.addr)
	run := fmt.Sprint(time.Now().UnixNano())
	var onHealthy, onPaused []string
	for i := 0; len(onHealthy) < 4 || len(onPaused) < 4; i++ {
		key := fmt.Sprint(run, "-", i)
		switch store := b.LeaseStore(key, p); {
		case store == healthyStore && len(onHealthy) < 4:
			onHealthy = append(onHealthy, key)
		case store == pausedStore && len(onPaused) < 4:
			onPaused = append(onPaused, key)
		}
	}
	paused.pause(t)

	ctx := context.Background()
	now := time.Now()
	var wg sync.WaitGroup
	var pausedCalls, pausedBlamed atomic.Int64
	for _, key := range onPaused {
		wg.Go(func() {
			for range 5 {
				_, err := b.Acquire(ctx, key, p, throttler.NewLeaseID(), now)
				pausedCalls.Add(1)
				var named interface{ FailedStore() string }
				if errors.Is(err, throttler.ErrUnavailable) && errors.As(err, &named) && named.FailedStore() == pausedStore {
					pausedBlamed.Add(1)
				} else {
					t.Errorf("%s on the paused server: %v, want its failure", key, err)
				}
			}
		})
	}
	var admitted [4]atomic.Int64
	for i, key := range onHealthy {
		wg.Go(func() {
			var ids []throttler.LeaseID
			for range p.Limit + 4 {
				id := throttler.NewLeaseID()
				d, err := b.Acquire(ctx, key, p, id, now)
				if !assert.NoError(t, err, "%s on the healthy server", key) {
					return
				}
				if d.Allowed {
					admitted[i].Add(1)
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				ok, _, err := b.Release(ctx, key, p, id, now)
				assert.NoError(t, err)
				assert.True(t, ok, "%s: lease held until released", key)
			}
		})
	}
	wg.Wait()
	t.Logf("paused server: %d calls, %d blamed on it", pausedCalls.Load(), pausedBlamed.Load())
	for i, key := range onHealthy {
		assert.Equal(t, p.Limit, admitted[i].Load(), "%s admits exactly Limit", key)
	}
	assert.Equal(t, pausedCalls.Load(), pausedBlamed.Load())

	// The healthy keys' items are on the healthy server, empty again.
	only := memcachedNew(t, memcachedClient(t, time.Second, healthy.addr), nil)
	for _, key := range onHealthy {
		_, d, err := only.Release(ctx, key, p, throttler.NewLeaseID(), now)
		require.NoError(t, err)
		assert.Zero(t, d.Used)
	}
}

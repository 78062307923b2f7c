package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestLeaseMemcachedExactness: leaseExactness on 4 clients of one server,
// with ErrContention (a call out of rounds) retried.
func TestLeaseMemcachedExactness(t *testing.T) {
	s := memcachedStart(t)
	var backends []throttler.LeaseBackend
	for _, b := range memcachedBackends(t, 4, s.addr) {
		backends = append(backends, b)
	}
	leaseExactness(t, backends, "hot", 200*time.Millisecond, isContention)
}

// TestLeaseMemcachedCrashedClient: a client that acquires every slot and
// dies without releasing holds them until their TTL, to the millisecond by
// the callers' clock, and not a moment longer.
func TestLeaseMemcachedCrashedClient(t *testing.T) {
	s := memcachedStart(t)
	p := throttler.ConcurrencyPolicy{Name: "crash", Limit: 5, TTL: 30 * time.Second}
	crashed := memcache.New(s.addr)
	crashed.Timeout = time.Second
	leaseCrashedClient(t, memcachedNew(t, crashed, nil), memcachedNew(t, memcachedClient(t, time.Second, s.addr), nil),
		crashed.Close, "k", p, time.Now().Truncate(time.Millisecond))
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
		switch store := throttler.TraitsOf(b).LeaseStore(key, p); {
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
				_, err := b.Acquire(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), now)
				pausedCalls.Add(1)
				if errors.Is(err, throttler.ErrUnavailable) && blamedStore(t, err) == pausedStore {
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
				id := throttler.LeaseID(rand.Uint64() | 1)
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
		_, d, err := only.Release(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), now)
		require.NoError(t, err)
		assert.Zero(t, d.Used)
	}
}

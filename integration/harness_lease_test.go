package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// leaseExactness: 32 goroutines per backend (each backend on a client of
// its own, as a process would have) acquire and release 10 leases each on
// key, holding each for work. The test counts the leases it holds, adding
// one after an admitted Acquire returns and taking it away before the
// Release is sent, so its count never exceeds what the store holds, and
// checks at every acquire that it is at most Limit. An error retried
// reports true for (nil: none) is counted: a denied Acquire for the
// caller, and a Release the caller sends again, as the lease would
// otherwise hold its slot for the TTL.
func leaseExactness(t *testing.T, backends []throttler.LeaseBackend, key string, work time.Duration, retried func(error) bool) {
	t.Helper()
	const goroutines, perGoroutine = 32, 10
	if retried == nil {
		retried = func(error) bool { return false }
	}
	p := throttler.ConcurrencyPolicy{Name: "exact", Limit: 20, TTL: time.Hour}
	ctx := context.Background()
	t0 := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	var held, peak, admitted, denied, contended, calls atomic.Int64
	var wg sync.WaitGroup
	for _, b := range backends {
		for g := range goroutines {
			wg.Go(func() {
				for i := range perGoroutine {
					now := t0.Add(time.Duration(g*perGoroutine+i) * time.Millisecond)
					id := throttler.LeaseID(rand.Uint64() | 1)
					calls.Add(1)
					d, err := b.Acquire(ctx, key, p, id, now)
					if err != nil && retried(err) {
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
						t.Errorf("%d leases held by the test, the store says %d: more than Limit %d", n, d.Used, p.Limit)
					}
					// The request's work, long beside a call's round trip,
					// so that the test's count comes near the store's.
					time.Sleep(work)
					held.Add(-1)
					for {
						calls.Add(1)
						ok, _, err := b.Release(ctx, key, p, id, now)
						if err != nil && retried(err) {
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
	t.Logf("%d calls: %d acquires admitted, %d denied, %d retried (%.3f%% of calls), at most %d leases held at once",
		calls.Load(), admitted.Load(), denied.Load(), contended.Load(), 100*float64(contended.Load())/float64(calls.Load()), peak.Load())
	assert.Positive(t, denied.Load(), "the limit was reached")
	assert.Greater(t, peak.Load(), p.Limit/2, "the test's count came near Limit, so the check at every acquire had teeth")
	_, d, err := backends[0].Release(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), t0.Add(time.Minute))
	require.NoError(t, err)
	assert.Zero(t, d.Used, "every lease was released")
}

// isContention reports Memcached's ErrContention, which leaseExactness's
// callers retry.
func isContention(err error) bool { return errors.Is(err, memcached.ErrContention) }

// leaseCrashedClient: crashed acquires all p.Limit (5) slots of key, at
// start plus 0 to 4 ms, and crash ends its client without releasing them;
// then other's Acquires find them held until their TTL, to the millisecond
// by the callers' clock, and not a moment longer.
func leaseCrashedClient(t *testing.T, crashed, other throttler.LeaseBackend, crash func() error, key string, p throttler.ConcurrencyPolicy, start time.Time) {
	t.Helper()
	require.EqualValues(t, 5, p.Limit, "the table below is for 5 leases")
	ctx := context.Background()
	for i := range p.Limit {
		d, err := crashed.Acquire(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), start.Add(time.Duration(i)*time.Millisecond))
		require.NoError(t, err)
		require.True(t, d.Allowed, "lease %d", i)
	}
	require.NoError(t, crash()) // gone, its leases never released

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
		d, err := other.Acquire(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), tt.at)
		require.NoError(t, err)
		at := tt.at.Sub(start)
		assert.Equal(t, tt.wantAllowed, d.Allowed, "at +%v", at)
		assert.Equal(t, tt.wantUsed, d.Used, "at +%v", at)
		assert.Equal(t, tt.wantRetry, d.RetryAfter, "at +%v", at)
	}
}

package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// memcachedItems are the items of a named fixed-window policy's key whose
// window ends at resetAt, as backend/memcached lays them out (keys.go) for
// a printable key under the default prefix. Tests that rely on it check
// that the backend used these very items.
func memcachedItems(name, key string, resetAt time.Time) (head, counter string) {
	id := strconv.Itoa(len(name)) + ":" + name + ":" + key
	return "throttlekit:w:" + id, "throttlekit:n:" + strconv.FormatInt(resetAt.UnixMilli(), 10) + ":" + id
}

// With one of two Memcached servers paused, each server has its own
// breaker: the healthy server's keys are limited exactly throughout, and
// the paused server's keys stop paying a timeout once its breaker opens.
func TestBreakerMemcachedOneOfTwoServersPaused(t *testing.T) {
	b, sel, healthy, paused := memcachedTwoServers(t)

	now := time.Now()
	p := throttler.Policy{Name: "two", Limit: 20, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())
	server := func(item string) string {
		addr, err := sel.PickServer(item)
		require.NoError(t, err)
		return addr.String()
	}
	healthyAddr, pausedAddr := resolvedAddr(t, healthy.addr), resolvedAddr(t, paused.addr)
	var onHealthy, onPaused []string
	for i := 0; len(onHealthy) < 6 || len(onPaused) < 6; i++ {
		key := fmt.Sprint(run, "-", i)
		head, counter := memcachedItems(p.Name, key, now.Add(p.Window))
		switch {
		case server(head) == healthyAddr && server(counter) == healthyAddr && len(onHealthy) < 6:
			onHealthy = append(onHealthy, key)
		case server(head) == pausedAddr && len(onPaused) < 6:
			onPaused = append(onPaused, key)
		}
	}

	var mu sync.Mutex
	reached := map[string]int{} // paused-server calls that reached it, by store name
	th, err := throttler.New(b, &throttler.Options{Timeout: memcachedFaultTimeout, Clock: func() time.Time { return now },
		Observe: func(o throttler.Observation) {
			if o.Err != nil && !strings.Contains(o.Err.Error(), "skipped") {
				mu.Lock()
				reached[o.Store]++
				mu.Unlock()
			}
		}})
	require.NoError(t, err)
	paused.pause(t)

	ctx := context.Background()
	var healthyAdmitted [6]atomic.Int64
	var healthyDegraded, pausedCalls atomic.Int64
	var wg sync.WaitGroup
	loadPaused := func() {
		for _, key := range onPaused {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					d, err := th.Allow(ctx, key, p)
					assert.NoError(t, err)
					assert.True(t, d.Degraded, "a key on the paused server fails open")
					pausedCalls.Add(1)
				}
			}()
		}
	}
	// First the paused server's keys fail until its breaker opens, then the
	// healthy server's keys run while the paused one's go on failing.
	loadPaused()
	wg.Wait()
	loadPaused()
	for i, key := range onHealthy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range p.Limit + 10 {
				d, err := th.Allow(ctx, key, p)
				if err != nil || d.Degraded {
					healthyDegraded.Add(1)
				}
				if d.Allowed && !d.Degraded {
					healthyAdmitted[i].Add(1)
				}
			}
		}()
	}
	wg.Wait()

	t.Logf("paused server: %d calls, %d reached it (%v); healthy server: %d degraded", pausedCalls.Load(), reached["memcached "+pausedAddr], reached, healthyDegraded.Load())
	assert.Zero(t, healthyDegraded.Load(), "the healthy server's keys are never degraded")
	for i, key := range onHealthy {
		assert.Equal(t, p.Limit, healthyAdmitted[i].Load(), "%s is limited exactly", key)
	}
	assert.Less(t, reached["memcached "+pausedAddr], int(pausedCalls.Load())/2, "the paused server's breaker opened")
	assert.Len(t, reached, 1, "only the paused server failed")

	// The healthy keys were counted where the layout says.
	only := memcache.New(healthy.addr)
	defer only.Close()
	_, counter := memcachedItems(p.Name, onHealthy[0], now.Add(p.Window))
	it, err := only.Get(counter)
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(p.Limit, 10), strings.TrimSpace(string(it.Value)))
}

// A corrupt head or a counter Memcached refuses to increment is that key's
// failure alone: it never opens the breaker, and the other keys stay
// limited.
func TestBreakerMemcachedCorruptItem(t *testing.T) {
	s := memcachedStart(t)
	// Nothing here is about time: generous timeouts, so that a loaded
	// machine's slow answer is never taken for the key's failure.
	c := memcachedClient(t, 2*time.Second, s.addr)
	now := time.Now()
	p := throttler.Policy{Name: "corrupt", Limit: 10, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())
	resetAt := now.Add(p.Window)

	badHead, badCounter := run+"-bad-head", run+"-bad-counter"
	head, _ := memcachedItems(p.Name, badHead, resetAt)
	require.NoError(t, c.Set(&memcache.Item{Key: head, Value: []byte("garbage"), Expiration: 3600}))
	head, counter := memcachedItems(p.Name, badCounter, resetAt)
	require.NoError(t, c.Set(&memcache.Item{Key: head, Value: []byte(strconv.FormatInt(resetAt.UnixMilli(), 10)), Expiration: 3600}))
	require.NoError(t, c.Set(&memcache.Item{Key: counter, Value: []byte("many"), Expiration: 3600}))

	var mu sync.Mutex
	var errs []error
	th, err := throttler.New(memcachedNew(t, c, nil), &throttler.Options{Timeout: 5 * time.Second, Clock: func() time.Time { return now },
		Observe: func(o throttler.Observation) {
			if o.Err != nil {
				mu.Lock()
				errs = append(errs, o.Err)
				mu.Unlock()
			}
		}})
	require.NoError(t, err)
	ctx := context.Background()
	for range 10 {
		for _, key := range []string{badHead, badCounter} {
			d, err := th.Allow(ctx, key, p)
			require.NoError(t, err)
			require.True(t, d.Degraded, "%s fails open", key)
		}
	}
	require.Len(t, errs, 20)
	for _, err := range errs {
		assert.ErrorIs(t, err, throttler.ErrKeyState)
		assert.False(t, errors.Is(err, throttler.ErrUnavailable), "%v", err)
	}
	assert.ErrorIs(t, errs[0], memcached.ErrBadItem, "the corrupt head")
	assert.Contains(t, errs[1].Error(), "non-numeric", "the counter Memcached refuses to increment")

	assertOthersLimited(t, th, run, p)
}

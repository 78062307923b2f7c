package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// Memcached as its package doc sets it up, on a bad day.

// memcachedPauseFor is how long a server stays paused under load.
const memcachedPauseFor = 3 * time.Second

// memcachedPace is the pause between the calls of one load goroutine.
const memcachedPace = time.Millisecond

// TestMemcachedBadDayOneServerPaused: a client over two servers built with
// memcache.New as the package doc shows (no Options.Selector, no
// MaxIdleConns). One server is paused for 3s under load; the keys whose
// items live on the other are decided by the store throughout (none Degraded, each limited
// exactly), because each server has its own breaker.
func TestMemcachedBadDayOneServerPaused(t *testing.T) {
	healthy, paused := memcachedStart(t), memcachedStart(t)
	c := memcache.New(healthy.addr, paused.addr)
	c.Timeout = memcachedFaultTimeout // the Throttler's
	t.Cleanup(func() { _ = c.Close() })
	b := memcachedNew(t, c, nil)

	// Where the client puts an item: a ServerList over the same addresses
	// picks as the client's does.
	sel := new(memcache.ServerList)
	require.NoError(t, sel.SetServers(healthy.addr, paused.addr))
	server := func(item string) string {
		addr, err := sel.PickServer(item)
		require.NoError(t, err)
		return addr.String()
	}
	healthyAddr, pausedAddr := resolvedAddr(t, healthy.addr), resolvedAddr(t, paused.addr)

	now := time.Now()
	p := throttler.Policy{Name: "badday", Limit: 200, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())
	const perServer = 8
	var onHealthy, onPaused []string
	for i := 0; len(onHealthy) < perServer || len(onPaused) < perServer; i++ {
		key := fmt.Sprint(run, "-", i)
		head, counter := memcachedItems(p.Name, key, now.Add(p.Window))
		switch {
		case server(head) == healthyAddr && server(counter) == healthyAddr && len(onHealthy) < perServer:
			onHealthy = append(onHealthy, key)
		case server(head) == pausedAddr && len(onPaused) < perServer:
			onPaused = append(onPaused, key)
		}
	}

	var mu sync.Mutex
	failedStores := map[string]int{} // stores named by failed calls
	th, err := throttler.New(b, &throttler.Options{Timeout: memcachedFaultTimeout, Clock: func() time.Time { return now },
		Observe: func(o throttler.Observation) {
			if o.Err != nil {
				mu.Lock()
				failedStores[o.Store]++
				mu.Unlock()
			}
		}})
	require.NoError(t, err)

	paused.pause(t)
	ctx := context.Background()
	end := time.Now().Add(memcachedPauseFor)
	var healthyCalls, healthyDegraded, pausedCalls, pausedDegraded atomic.Int64
	var admitted [perServer]atomic.Int64
	var wg sync.WaitGroup
	for i := range perServer {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for paced(end) {
				d, err := th.Allow(ctx, onHealthy[i], p)
				assert.NoError(t, err)
				healthyCalls.Add(1)
				if d.Degraded {
					healthyDegraded.Add(1)
				} else if d.Allowed {
					admitted[i].Add(1)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for paced(end) {
				d, err := th.Allow(ctx, onPaused[i], p)
				assert.NoError(t, err)
				pausedCalls.Add(1)
				if d.Degraded {
					pausedDegraded.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	paused.unpause(t)

	t.Logf("paused %v: healthy server's keys: %d calls, %d Degraded; paused server's keys: %d calls, %d Degraded; failures by store: %v",
		memcachedPauseFor, healthyCalls.Load(), healthyDegraded.Load(), pausedCalls.Load(), pausedDegraded.Load(), failedStores)
	assert.Zero(t, healthyDegraded.Load(), "the healthy server's keys are decided by it")
	for i, key := range onHealthy {
		assert.Equal(t, p.Limit, admitted[i].Load(), "%s is limited exactly", key)
	}
	assert.Equal(t, pausedCalls.Load(), pausedDegraded.Load(), "the paused server's keys fail open")
	assert.Equal(t, []string{"memcached " + pausedAddr}, keysOf(failedStores), "only the paused server failed, named")
}

// TestMemcachedBadDayHealthyUnderLoad: 64 goroutines call a healthy
// server as fast as they can, through a client built as the package doc
// builds it (gomemcache's default pool, which New sizes; the client's
// Timeout that of the Throttler). A call in flight while the loaded
// process stalls may time out, but the server answers every other: at most
// 1% of the calls are Degraded, in the first stage (connections opened
// under load) as in the later ones. It runs without the race detector.
func TestMemcachedBadDayHealthyUnderLoad(t *testing.T) {
	if raceDetector {
		t.Skip("a load figure, measured without -race (make integration runs it so): the race detector slows each call several times")
	}
	const goroutines, perGoroutine, stages = 64, 150, 3
	s := memcachedStart(t)
	c := memcache.New(s.addr)
	c.Timeout = memcachedFaultTimeout
	t.Cleanup(func() { _ = c.Close() })
	b := memcachedNew(t, c, nil)
	var mu sync.Mutex
	failures := map[string]int{} // by the error's text up to the key
	th, err := throttler.New(b, &throttler.Options{Timeout: memcachedFaultTimeout, Observe: func(o throttler.Observation) {
		if o.Err != nil {
			msg, _, _ := strings.Cut(o.Err.Error(), `"`)
			mu.Lock()
			failures[msg]++
			mu.Unlock()
		}
	}})
	require.NoError(t, err)
	p := throttler.Policy{Name: "load", Limit: throttler.MaxLimit, Window: time.Hour}
	run := fmt.Sprint(time.Now().UnixNano())
	for stage := range stages {
		var degraded atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perGoroutine {
					d, err := th.Allow(context.Background(), fmt.Sprint(run, "-", g, "-", i%10), p)
					assert.NoError(t, err)
					if d.Degraded {
						degraded.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		calls := goroutines * perGoroutine
		t.Logf("stage %d: %d calls, %d Degraded", stage, calls, degraded.Load())
		assert.LessOrEqual(t, degraded.Load(), int64(calls/100), "stage %d: at most 1%% Degraded", stage)
	}
	t.Logf("failures: %v", failures)
}

// paced reports whether a load loop goes on until end, after a pause of
// memcachedPace: requests arrive at a rate, and a caller answered at once
// (a breaker open) does not turn into a spinning loop that starves the
// calls under test of CPU.
func paced(end time.Time) bool {
	time.Sleep(memcachedPace)
	return time.Now().Before(end)
}

func keysOf(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestMemcachedFaults takes Memcached away mid-load, by pausing its
// container (a stalled server: calls hang until the client's timeout) or
// stopping it (a dead one: connections are refused), under a Throttler that
// fails open, with and without a memory fallback. Every call must be answered
// within the Throttler's timeout plus a small margin, the fallback must keep
// limiting, and once Memcached is back the decisions must come from it again.
func TestMemcachedFaults(t *testing.T) {
	for _, fault := range []string{"pause", "stop"} {
		for _, fallback := range []bool{false, true} {
			name := fault + "/fail-open"
			if fallback {
				name = fault + "/memory-fallback"
			}
			t.Run(name, func(t *testing.T) { memcachedTestFault(t, fault, fallback) })
		}
	}
}

const (
	memcachedFaultTimeout = 100 * time.Millisecond
	// memcachedClientTimeout bounds each gomemcache call, which takes no
	// context: below the Throttler's timeout, as the package documents.
	memcachedClientTimeout = 60 * time.Millisecond
	// memcachedFaultMargin is what a call may take beyond the timeout:
	// scheduling on a 2-core machine shared with the server and other tests.
	memcachedFaultMargin = 150 * time.Millisecond
)

func memcachedTestFault(t *testing.T, fault string, fallback bool) {
	s := memcachedStart(t)
	// Everything started from here on must be gone when the test ends. The
	// Docker client's idle HTTP connections are testcontainers', not ours.
	leaks := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
	c := memcachedClient(t, memcachedClientTimeout, s.addr)
	b := memcached.New(c, nil)

	var fromPrimary, fromFallback, fromFailureMode atomic.Int64
	opts := &throttler.Options{
		Timeout: memcachedFaultTimeout,
		Observe: func(o throttler.Observation) {
			switch o.Source {
			case throttler.SourcePrimary:
				fromPrimary.Add(1)
			case throttler.SourceFallback:
				fromFallback.Add(1)
			case throttler.SourceFailureMode:
				fromFailureMode.Add(1)
			}
		},
	}
	if fallback {
		opts.Fallback = memory.New(nil)
	}
	thr := throttler.New(b, opts)
	ctx := context.Background()
	run := fmt.Sprint(time.Now().UnixNano())

	// Load: 8 goroutines, each on its own key with room to spare, until told
	// to stop. Every call's latency is checked.
	const workers = 8
	loose := throttler.Policy{Name: "load", Limit: 1 << 40, Window: time.Hour}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var slowest, calls, denied, errs atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint(run, "-worker-", w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				d, err := thr.Allow(ctx, key, loose)
				el := int64(time.Since(start))
				for s := slowest.Load(); el > s && !slowest.CompareAndSwap(s, el); s = slowest.Load() {
				}
				calls.Add(1)
				if err != nil {
					errs.Add(1)
				} else if !d.Allowed {
					denied.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}

	memcachedWaitFor(t, 5*time.Second, "decisions from Memcached", func() bool { return fromPrimary.Load() > 50 })

	switch fault {
	case "pause":
		s.pause(t)
	case "stop":
		s.stop(t)
	}
	degradedBefore := fromFallback.Load() + fromFailureMode.Load()
	memcachedWaitFor(t, 5*time.Second, "degraded decisions", func() bool {
		return fromFallback.Load()+fromFailureMode.Load() > degradedBefore+100
	})

	// While Memcached is away, a fresh key is still limited by the
	// fallback, or allowed by failing open.
	strict := throttler.Policy{Name: "strict", Limit: 5, Window: time.Hour}
	key := run + "-strict"
	allowed := 0
	for i := 0; i < 2*int(strict.Limit); i++ {
		start := time.Now()
		d, err := thr.Allow(ctx, key, strict)
		require.NoError(t, err)
		assert.Less(t, time.Since(start), memcachedFaultTimeout+memcachedFaultMargin, "call %d during the outage", i)
		assert.True(t, d.Degraded, "call %d during the outage: %+v", i, d)
		if d.Allowed {
			allowed++
		}
		if fallback {
			assert.True(t, d.Known(), "the fallback counts: %+v", d)
		}
	}
	if fallback {
		assert.Equal(t, int(strict.Limit), allowed, "the memory fallback keeps limiting")
		assert.Zero(t, fromFailureMode.Load(), "the fallback answered every failed call")
	} else {
		assert.Equal(t, 2*int(strict.Limit), allowed, "fail open")
	}

	switch fault {
	case "pause":
		s.unpause(t)
	case "stop":
		s.start(t) // empty: the workers' windows open again
	}
	recovered := fromPrimary.Load()
	memcachedWaitFor(t, 10*time.Second, "decisions from Memcached again", func() bool { return fromPrimary.Load() > recovered+100 })
	close(stop)
	wg.Wait()

	d, err := thr.Allow(ctx, run+"-after", strict)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "after recovery: %+v", d)
	stored, err := memcached.New(c, &memcached.Options{NoCache: true}).Peek(ctx, run+"-after", strict, time.Now())
	require.NoError(t, err)
	assert.Equal(t, int64(1), stored.Used, "the decision after recovery was counted in Memcached")

	assert.Zero(t, errs.Load(), "a Throttler failing open never errors")
	assert.Zero(t, denied.Load(), "loose keys are never denied")
	assert.Less(t, time.Duration(slowest.Load()), memcachedFaultTimeout+memcachedFaultMargin,
		"slowest of %d calls under load", calls.Load())
	t.Logf("%d calls: %d from Memcached, %d from the fallback, %d failed open; slowest %v",
		calls.Load(), fromPrimary.Load(), fromFallback.Load(), fromFailureMode.Load(), time.Duration(slowest.Load()))

	require.NoError(t, c.Close())
	goleak.VerifyNone(t, leaks...)
}

// memcachedWaitFor polls cond every 20ms until it holds, failing the test
// after timeout.
func memcachedWaitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

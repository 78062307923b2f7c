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

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// faultScenario is what differs between the backends that faultScenario.run
// takes away mid-load: every backend is proven by the same scenario, with
// the same bounds.
type faultScenario struct {
	name    string            // the server, in messages: "Redis", "Memcached"
	backend throttler.Backend // the Throttler's primary, on a client of the server
	// leaks are the goroutines the leak check ignores: take them with
	// faultLeaks after the server started and before its client, so that
	// the client's goroutines are checked.
	leaks []goleak.Option
	// timeout is the Throttler's; every call must be answered within
	// timeout+margin.
	timeout, margin time.Duration

	pause, unpause func(t *testing.T) // stall the server, and resume it
	stop, start    func(t *testing.T) // kill the server, and start it again, empty
	// stored checks that the decision for key under p, taken once the
	// server was back, was counted in the server.
	stored func(t *testing.T, key string, p throttler.Policy)
	// closeClient closes the client behind backend, before the leak check.
	closeClient func() error
}

// faultLeaks ignores the goroutines running now and the Docker client's idle
// HTTP connections, which are testcontainers', not ours: everything started
// from here on must be gone when the test ends.
func faultLeaks() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}

// faultSubtests are the subtests of each backend's fault test: the fault
// ("pause": a stalled server, calls hang until a timeout; "stop": a dead
// one, connections are refused), then a Throttler failing open with or
// without a memory fallback.
func faultSubtests(t *testing.T, f func(t *testing.T, fault string, fallback bool)) {
	for _, fault := range []string{"pause", "stop"} {
		for _, fallback := range []bool{false, true} {
			name := fault + "/fail-open"
			if fallback {
				name = fault + "/memory-fallback"
			}
			t.Run(name, func(t *testing.T) { f(t, fault, fallback) })
		}
	}
}

// run takes the server away (fault "pause" or "stop") under load, through a
// Throttler that fails open, with a memory fallback or without. Every call
// must be answered within the timeout plus the margin, the fallback must
// keep limiting, and once the server is back the decisions must come from
// it again.
func (sc *faultScenario) run(t *testing.T, fault string, fallback bool) {
	var fromPrimary, fromFallback, fromFailureMode atomic.Int64
	opts := &throttler.Options{
		Timeout: sc.timeout,
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
		m, err := memory.New(nil)
		require.NoError(t, err)
		opts.Fallback = m
	}
	thr, err := throttler.New(sc.backend, opts)
	require.NoError(t, err)
	ctx := context.Background()
	run := fmt.Sprint(time.Now().UnixNano())

	// Load: 8 goroutines, each on its own key with room to spare, until told
	// to stop. Every call's latency is checked. A window of a second: a key
	// the fallback answered goes back to the server when its fallback
	// window ends.
	const workers = 8
	loose := throttler.Policy{Name: "load", Limit: 1 << 40, Window: time.Second}
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

	// Healthy first.
	waitFor(t, 5*time.Second, "decisions from "+sc.name, func(context.Context) bool { return fromPrimary.Load() > 50 })

	// Fault.
	switch fault {
	case "pause":
		sc.pause(t)
	case "stop":
		sc.stop(t)
	default:
		t.Fatalf("unknown fault %q", fault)
	}
	degradedBefore := fromFallback.Load() + fromFailureMode.Load()
	waitFor(t, 5*time.Second, "degraded decisions", func(context.Context) bool {
		return fromFallback.Load()+fromFailureMode.Load() > degradedBefore+100
	})

	// While the server is away, a fresh key is still limited by the
	// fallback, or allowed by failing open.
	strict := throttler.Policy{Name: "strict", Limit: 5, Window: time.Hour}
	key := run + "-strict"
	allowed := 0
	for i := 0; i < 2*int(strict.Limit); i++ {
		start := time.Now()
		d, err := thr.Allow(ctx, key, strict)
		require.NoError(t, err)
		assert.Less(t, time.Since(start), sc.timeout+sc.margin, "call %d during the outage", i)
		assert.True(t, d.Degraded, "call %d during the outage: %+v", i, d)
		if d.Allowed {
			allowed++
		}
		if fallback {
			assert.False(t, d.ResetAt.IsZero(), "the fallback counts: %+v", d)
		}
	}
	if fallback {
		assert.Equal(t, int(strict.Limit), allowed, "the memory fallback keeps limiting")
		assert.Zero(t, fromFailureMode.Load(), "the fallback answered every failed call")
	} else {
		assert.Equal(t, 2*int(strict.Limit), allowed, "fail open")
	}

	// Recovery.
	switch fault {
	case "pause":
		sc.unpause(t)
	case "stop":
		sc.start(t) // empty: the workers' windows open again
	}
	recovered := fromPrimary.Load()
	waitFor(t, 10*time.Second, "decisions from "+sc.name+" again", func(context.Context) bool {
		return fromPrimary.Load() > recovered+100
	})
	close(stop)
	wg.Wait()

	d, err := thr.Allow(ctx, run+"-after", strict)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "after recovery: %+v", d)
	sc.stored(t, run+"-after", strict)

	assert.Zero(t, errs.Load(), "a Throttler failing open never errors")
	assert.Zero(t, denied.Load(), "loose keys are never denied")
	assert.Less(t, time.Duration(slowest.Load()), sc.timeout+sc.margin,
		"slowest of %d calls under load", calls.Load())
	t.Logf("%d calls: %d from %s, %d from the fallback, %d failed open; slowest %v",
		calls.Load(), fromPrimary.Load(), sc.name, fromFallback.Load(), fromFailureMode.Load(), time.Duration(slowest.Load()))

	require.NoError(t, sc.closeClient())
	goleak.VerifyNone(t, sc.leaks...)
}

package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestRedisFaults takes Redis away mid-load, by pausing its container (a
// stalled server: connections hang) or stopping it (a dead one: connections
// are refused), under a Throttler that fails open, with and without a memory
// fallback. Every call must be answered within the timeout plus a small
// margin, the fallback must keep limiting, and once Redis is back the
// decisions must come from it again.
func TestRedisFaults(t *testing.T) {
	for _, fault := range []string{"pause", "stop"} {
		for _, fallback := range []bool{false, true} {
			name := fault + "/fail-open"
			if fallback {
				name = fault + "/memory-fallback"
			}
			t.Run(name, func(t *testing.T) { redisTestFault(t, fault, fallback, false) })
		}
	}
	// The docs recommend go-redis's AutoPipeliner under high concurrency: it
	// must honour the Throttler's deadline as well.
	t.Run("pause/fail-open/autopipeline", func(t *testing.T) { redisTestFault(t, "pause", false, true) })
}

const (
	redisFaultTimeout = 100 * time.Millisecond
	// redisFaultMargin is what a call may take beyond the timeout: scheduling
	// on a 2-core machine shared with the server and other tests.
	redisFaultMargin = 150 * time.Millisecond
)

func redisTestFault(t *testing.T, fault string, fallback, autoPipeline bool) {
	rc := redisStart(t)
	// Everything started from here on must be gone when the test ends. The
	// Docker client's idle HTTP connections are testcontainers', not ours.
	leaks := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
	c := redisClient(t, rc.Addr)
	b := redis.New(c, nil)
	if autoPipeline {
		// The AutoPipeliner's blocking calls wait for their batch whatever
		// the caller's context says (go-redis v9.23); a batch is bounded by
		// the client's socket timeouts instead, so those must add up to no
		// more than the Throttler's timeout.
		require.NoError(t, c.Close())
		c = goredis.NewClient(&goredis.Options{
			Addr:                  rc.Addr,
			ContextTimeoutEnabled: true,
			ReadTimeout:           redisFaultTimeout / 4,
			WriteTimeout:          redisFaultTimeout / 4,
			DialTimeout:           redisFaultTimeout / 4,
			MaxRetries:            -1,
		})
		t.Cleanup(func() { c.Close() })
		ap, err := c.AutoPipeline()
		require.NoError(t, err)
		b = redis.New(ap, nil)
	}

	var fromRedis, fromFallback, fromFailureMode atomic.Int64
	opts := &throttler.Options{
		Timeout: redisFaultTimeout,
		Observe: func(o throttler.Observation) {
			switch o.Source {
			case throttler.SourcePrimary:
				fromRedis.Add(1)
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
	var slowest atomic.Int64
	var calls, denied, errs atomic.Int64
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
				el := time.Since(start)
				for {
					s := slowest.Load()
					if int64(el) <= s || slowest.CompareAndSwap(s, int64(el)) {
						break
					}
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
	redisWaitFor(t, 5*time.Second, "decisions from Redis", func(context.Context) bool { return fromRedis.Load() > 50 })

	// Fault.
	switch fault {
	case "pause":
		redisPause(t, rc)
	case "stop":
		timeout := time.Duration(0)
		require.NoError(t, rc.c.Stop(ctx, &timeout))
	}
	degradedBefore := fromFallback.Load() + fromFailureMode.Load()
	redisWaitFor(t, 5*time.Second, "degraded decisions", func(context.Context) bool {
		return fromFallback.Load()+fromFailureMode.Load() > degradedBefore+100
	})

	// While Redis is away, a fresh key is still limited by the fallback, or
	// allowed by failing open.
	strict := throttler.Policy{Name: "strict", Limit: 5, Window: time.Hour}
	key := run + "-strict"
	allowed := 0
	for i := 0; i < 2*int(strict.Limit); i++ {
		start := time.Now()
		d, err := thr.Allow(ctx, key, strict)
		require.NoError(t, err)
		assert.Less(t, time.Since(start), redisFaultTimeout+redisFaultMargin, "call %d during the outage", i)
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

	// Recovery.
	switch fault {
	case "pause":
		redisUnpause(t, rc)
	case "stop":
		require.NoError(t, rc.c.Start(ctx))
	}
	recovered := fromRedis.Load()
	redisWaitFor(t, 10*time.Second, "decisions from Redis again", func(context.Context) bool { return fromRedis.Load() > recovered+100 })
	close(stop)
	wg.Wait()

	d, err := thr.Allow(ctx, run+"-after", strict)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "after recovery: %+v", d)
	stored, err := c.Keys(ctx, "throttlekit:*"+run+"-after").Result()
	require.NoError(t, err)
	assert.Len(t, stored, 1, "the decision after recovery was counted in Redis")

	assert.Zero(t, errs.Load(), "a Throttler failing open never errors")
	assert.Zero(t, denied.Load(), "loose keys are never denied")
	assert.Less(t, time.Duration(slowest.Load()), redisFaultTimeout+redisFaultMargin,
		"slowest of %d calls under load", calls.Load())
	t.Logf("%d calls: %d from Redis, %d from the fallback, %d failed open; slowest %v",
		calls.Load(), fromRedis.Load(), fromFallback.Load(), fromFailureMode.Load(), time.Duration(slowest.Load()))

	require.NoError(t, c.Close())
	goleak.VerifyNone(t, leaks...)
}

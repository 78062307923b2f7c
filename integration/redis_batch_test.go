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
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestRedisBatch proves batching on every topology, with batching as built
// by default: exactness across clients, and a load whose callers leave at
// random instants, each answered with its own operation's decision. The
// conformance suite with every answer from a batch runs in backend/redis
// (TestConformanceThroughBatches), which can ask a Backend for that.
func TestRedisBatch(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		rc := redisStart(t)
		c := redisClient(t, rc.Addr)
		t.Run("ExactAcrossProcesses", func(t *testing.T) {
			redisTestExactAcrossClients(t, func() throttler.Backend { return redisNew(t, redisClient(t, rc.Addr), nil) })
		})
		t.Run("CallersLeaving", func(t *testing.T) {
			redisTestCallersLeaving(t, redisNew(t, c, &redis.Options{Prefix: "leave:"}), nil)
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		addrs := redisCluster(t, 3)
		c := redisClusterClient(t, addrs)
		t.Run("ExactAcrossProcesses", func(t *testing.T) {
			redisTestExactAcrossClients(t, func() throttler.Backend { return redisNew(t, redisClusterClient(t, addrs), nil) })
		})
		t.Run("CallersLeaving", func(t *testing.T) {
			redisTestCallersLeaving(t, redisNew(t, c, &redis.Options{Prefix: "leave:"}), nil)
		})
	})
	t.Run("ShardsWithReplicas", func(t *testing.T) {
		shards, primaries := redisShardsWithReplicas(t)
		newBackend := func(t *testing.T) *redis.Backend {
			b, err := redis.NewSharded(shards, &redis.Options{Prefix: "b:"})
			require.NoError(t, err)
			return b
		}
		t.Run("ExactAcrossProcesses", func(t *testing.T) {
			redisTestExactAcrossClients(t, func() throttler.Backend { return newBackend(t) })
		})
		t.Run("CallersLeaving", func(t *testing.T) {
			redisTestCallersLeaving(t, newBackend(t), (&redisReplicated{primaries: primaries, replicas: 2}).sync)
		})
	})
}

// redisTestCallersLeaving: 64 goroutines, each call a Take on a key of its
// own with a cost of its own, then a Peek, a third of the Takes on contexts
// that end at a random instant. A Take that answers must answer for its own
// key and cost, and Redis must hold that cost once; one whose caller left
// returns its context's error. Batches must have formed, and no goroutine
// is left behind.
func redisTestCallersLeaving(t *testing.T, b *redis.Backend, replicate func(context.Context) error) {
	defer goleak.VerifyNone(t, faultLeaks()...)
	p := throttler.Policy{Name: "leave", Limit: 100, Window: time.Hour}
	const goroutines, calls = 64, 40
	var left atomic.Int64
	var wg sync.WaitGroup
	answered := make([]map[string]int64, goroutines)
	for g := range goroutines {
		answered[g] = map[string]int64{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for i := range calls {
				key := fmt.Sprintf("g%d-%d", g, i)
				cost := int64(1 + (g*calls+i)%97)
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(2000))*time.Microsecond)
				}
				d, err := b.Take(ctx, key, p, cost, redisT0)
				// A socket deadline, or go-redis's own check of the
				// context's, can fire a moment before the context's timer.
				deadline, ok := ctx.Deadline()
				ended := ctx.Err() != nil || ok && !time.Now().Before(deadline)
				cancel()
				if err != nil {
					// A call sent at once fails as its client's socket
					// deadline does (i/o timeout), a queued one with its
					// context's error: either way, its caller's context ended.
					if !assert.True(t, ended, "%s: %v", key, err) {
						return
					}
					left.Add(1)
					continue
				}
				if !assert.True(t, d.Allowed && d.Used == cost, "%s cost %d: %+v", key, cost, d) {
					return
				}
				answered[g][key] = cost
			}
		}()
	}
	wg.Wait()
	if replicate != nil {
		require.NoError(t, replicate(context.Background())) // Peek reads replicas
	}
	for _, m := range answered {
		for key, cost := range m {
			d, err := b.Peek(context.Background(), key, p, redisT0)
			require.NoError(t, err)
			require.Equal(t, cost, d.Used, "%s: Redis holds", key)
		}
	}
	s := b.Stats()
	t.Logf("%d callers left; %+v", left.Load(), s)
	assert.NotZero(t, s.Batched, "no batch formed")
}

// TestRedisBatchPaused pauses Redis while 64 goroutines have batches in
// flight: every caller must return within its own timeout, whatever its
// batch waits for; once Redis is back, calls are answered again and no
// goroutine is left. A caller's return past its timeout includes the wait
// for a CPU after its context ended, which other work on the machine
// stretches: beside each caller a twin waits for contexts of the same
// timeouts and nothing else, and the callers may be late by the twins'
// worst lateness plus redisFaultMargin.
func TestRedisBatchPaused(t *testing.T) {
	rc := redisStart(t)
	leaks := faultLeaks()
	c := goredis.NewClient(&goredis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true, PoolSize: 64, MaxRetries: -1})
	b := redisNew(t, c, nil)
	p := throttler.Policy{Name: "paused", Limit: 1 << 40, Window: time.Hour}
	const goroutines = 64
	var (
		wg              sync.WaitGroup
		stop            atomic.Bool
		calls, failures atomic.Int64
		slowest, lag    atomic.Int64
	)
	// Timeouts differ from caller to caller, so that one batch holds
	// callers of several.
	timeoutOf := func(g int) time.Duration { return redisFaultTimeout + time.Duration(g%4)*25*time.Millisecond }
	for g := range goroutines {
		wg.Go(func() { // the caller's twin: the scheduling delay alone
			for !stop.Load() {
				timeout := timeoutOf(g)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				start := time.Now()
				<-ctx.Done()
				storeMax(&lag, int64(time.Since(start)-timeout))
				cancel()
			}
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				timeout := timeoutOf(g)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				start := time.Now()
				_, err := b.Take(ctx, fmt.Sprint("k", (g+i)%16), p, 1, redisT0)
				over := time.Since(start) - timeout
				cancel()
				calls.Add(1)
				if err != nil {
					failures.Add(1)
				}
				storeMax(&slowest, int64(over))
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // load before the pause
	before := b.Stats()
	redisPause(t, rc)
	time.Sleep(time.Second) // paused: every call times out
	failed := failures.Load()
	redisUnpause(t, rc)
	time.Sleep(500 * time.Millisecond) // recovered
	stop.Store(true)
	wg.Wait()
	assert.NotZero(t, before.Batched, "no batches before the pause: %+v", before)
	assert.NotZero(t, failed, "no call failed while Redis was paused")
	over, late := time.Duration(slowest.Load()), time.Duration(lag.Load())
	t.Logf("%d calls, %d failed; the slowest returned %v after its timeout, the twins saw their contexts end up to %v late; %+v",
		calls.Load(), failures.Load(), over, late, b.Stats())
	assert.LessOrEqual(t, over, late+redisFaultMargin, "a caller outlived its timeout by more than the scheduling delay measured beside it")
	d, err := b.Take(context.Background(), "after", p, 1, redisT0)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, leaks...)
}

// storeMax raises m to v if v is greater.
func storeMax(m *atomic.Int64, v int64) {
	for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
	}
}

package benchmarks

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// redisServe starts redis-server on a free loopback port, without
// persistence, and returns its address; the server is killed when the
// benchmark ends. It skips the benchmark when redis-server is not installed.
func redisServe(b *testing.B) string {
	b.Helper()
	return serve(b, "redis-server", func(port string) []string {
		return []string{"--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no"}
	}, func(addr string) error {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		return c.Ping(context.Background()).Err()
	})
}

// redisBackend is redis.New for a client that cannot be wrong.
func redisBackend(b *testing.B, c redis.Client, opts *redis.Options) *redis.Backend {
	b.Helper()
	be, err := redis.New(c, opts)
	if err != nil {
		b.Fatal(err)
	}
	return be
}

// redisFloorScript is the least a one-round-trip fixed-window limiter can
// do: count and set the expiry, nothing read, nothing returned but the
// count.
var redisFloorScript = goredis.NewScript(`local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return v`)

// BenchmarkRedisTake compares Backend.Take with the one-round-trip floor (a
// bare EVALSHA of INCRBY+PEXPIREAT) and with redis_rate/v10's Allow, on 1
// goroutine and on 64, each goroutine on its own key, every call admitted.
// The autopipeline variants hand the same code go-redis's AutoPipeliner,
// which batches concurrent callers' commands into pipelines.
func BenchmarkRedisTake(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	rateLimit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}

	for _, goroutines := range []int{1, 64} {
		c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: goroutines})
		b.Cleanup(func() { _ = c.Close() })
		if err := redisFloorScript.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		clients := []struct {
			suffix string
			c      redis.Client
		}{{"", c}}
		if goroutines > 1 {
			clients = append(clients, struct {
				suffix string
				c      redis.Client
			}{"-autopipeline", ap})
		}
		for _, cl := range clients {
			b.Run(fmt.Sprintf("floor-evalsha%s/goroutines=%d", cl.suffix, goroutines), func(b *testing.B) {
				reset := strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10)
				redisRun(b, goroutines, "floor", func(key string) error {
					return redisFloorScript.EvalSha(ctx, cl.c, []string{key}, 1, reset).Err()
				})
			})
			b.Run(fmt.Sprintf("take%s/goroutines=%d", cl.suffix, goroutines), func(b *testing.B) {
				be := redisBackend(b, cl.c, nil)
				redisRun(b, goroutines, "take", func(key string) error {
					d, err := be.Take(ctx, key, p, 1, now)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					return err
				})
			})
			b.Run(fmt.Sprintf("redis_rate%s/goroutines=%d", cl.suffix, goroutines), func(b *testing.B) {
				var rdb interface {
					redis.Client
					Del(ctx context.Context, keys ...string) *goredis.IntCmd
				}
				switch x := cl.c.(type) {
				case *goredis.Client:
					rdb = x
				case *goredis.AutoPipeliner:
					rdb = x
				}
				l := redis_rate.NewLimiter(rdb)
				redisRun(b, goroutines, "rate", func(key string) error {
					res, err := l.Allow(ctx, key, rateLimit)
					if err == nil && res.Allowed == 0 {
						err = fmt.Errorf("denied: %+v", res)
					}
					return err
				})
			})
		}
	}
}

// BenchmarkRedisTakeLatencyPaired measures the 1-goroutine latencies of the
// floor, Take and redis_rate in one loop, one call of each per iteration,
// so that all three see the same machine: on a shared 2-core machine the
// load of other processes moves separate benchmarks by more than the
// differences being measured. It reports each one's mean (ns/call) and
// Take's ratios to the other two.
func BenchmarkRedisTakeLatencyPaired(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 1})
	b.Cleanup(func() { _ = c.Close() })
	if err := redisFloorScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	be := redisBackend(b, c, nil)
	l := redis_rate.NewLimiter(c)
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	rateLimit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}
	reset := strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var floor, take, rate time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + run}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if d, err := be.Take(ctx, "take:"+run, p, 1, now); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		t2 := time.Now()
		if res, err := l.Allow(ctx, "rate:"+run, rateLimit); err != nil || res.Allowed == 0 {
			b.Fatal(res, err)
		}
		t3 := time.Now()
		floor += t1.Sub(t0)
		take += t2.Sub(t1)
		rate += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns/call")
	b.ReportMetric(float64(take.Nanoseconds())/n, "take-ns/call")
	b.ReportMetric(float64(rate.Nanoseconds())/n, "redis_rate-ns/call")
	b.ReportMetric(float64(take)/float64(floor), "take/floor")
	b.ReportMetric(float64(take)/float64(rate), "take/redis_rate")
}

// BenchmarkRedisThroughputPaired compares throughput at 64 goroutines
// (each on its own key, one client with a pool of 64 connections) the way
// BenchmarkRedisTakeLatencyPaired compares latency: each iteration is one
// round in which every variant runs for redisBurst in turn, so that all
// see the same machine. It reports each variant's calls/s over all rounds
// and Take's ratios; run it with -benchtime=Nx (N rounds).
func BenchmarkRedisThroughputPaired(b *testing.B) {
	const goroutines = 64
	addr := redisServe(b)
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: goroutines})
	b.Cleanup(func() { _ = c.Close() })
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	rateLimit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}
	take, takeAP := redisBackend(b, c, nil), redisBackend(b, ap, nil)
	rate, rateAP := redis_rate.NewLimiter(c), redis_rate.NewLimiter(ap)
	perSec := redisRounds(b, goroutines, []redisVariant{
		{"take", func(key string) error { _, err := take.Take(ctx, key, p, 1, now); return err }},
		{"take-autopipeline", func(key string) error { _, err := takeAP.Take(ctx, key, p, 1, now); return err }},
		{"redis_rate", func(key string) error { _, err := rate.Allow(ctx, key, rateLimit); return err }},
		{"redis_rate-autopipeline", func(key string) error { _, err := rateAP.Allow(ctx, key, rateLimit); return err }},
	})
	b.ReportMetric(perSec[0]/perSec[2], "take/redis_rate")
	b.ReportMetric(perSec[1]/perSec[2], "take-autopipeline/redis_rate")
	b.ReportMetric(perSec[1]/perSec[3], "take-autopipeline/redis_rate-autopipeline")
}

// redisBurst is how long each variant runs in a round of
// BenchmarkRedisThroughputPaired.
const redisBurst = 200 * time.Millisecond

// redisVariant is one way to make a call, named for its metric.
type redisVariant struct {
	name string
	f    func(key string) error
}

// redisRounds runs paired rounds, one per iteration of b: in each, every
// variant in turn runs for redisBurst on goroutines goroutines, each on its
// own key. It reports and returns each variant's calls/s over all rounds.
func redisRounds(b *testing.B, goroutines int, variants []redisVariant) []float64 {
	calls := make([]int64, len(variants))
	var elapsed time.Duration
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for b.Loop() {
		for i, v := range variants {
			var n atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range goroutines {
				wg.Go(func() {
					key := v.name + ":" + run + ":" + strconv.Itoa(g)
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := v.f(key); err != nil {
							b.Error(err)
							return
						}
						n.Add(1)
					}
				})
			}
			time.Sleep(redisBurst)
			close(stop)
			wg.Wait()
			calls[i] += n.Load()
		}
		elapsed += redisBurst
	}
	perSec := make([]float64, len(variants))
	for i, v := range variants {
		perSec[i] = float64(calls[i]) / elapsed.Seconds()
		b.ReportMetric(perSec[i], v.name+"-calls/s")
	}
	return perSec
}

// redisRun calls f b.N times over the given number of goroutines, each
// with a key of its own.
func redisRun(b *testing.B, goroutines int, prefix string, f func(key string) error) {
	b.ReportAllocs()
	run := prefix + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	if goroutines == 1 {
		key := run + "0"
		for b.Loop() {
			if err := f(key); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	var n atomic.Int64
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		key := run + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			if err := f(key); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

package benchmarks

import (
	"context"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRedisAlgorithmsTakePaired measures, on 1 goroutine, the latency
// of each algorithm's Take against the one-round-trip floor (a bare
// EVALSHA of INCRBY+PEXPIREAT), in one loop, one call of each per
// iteration, so that all see the same machine (see
// BenchmarkRedisTakeLatencyPaired). The clock moves 1 ms per iteration and
// every call is admitted: the sliding logs hold about Limit live entries,
// 100 and 10,000 (the bound), which each Take reads. It reports each one's
// mean (ns/call) and its ratio to the floor.
func BenchmarkRedisAlgorithmsTakePaired(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 1})
	b.Cleanup(func() { _ = c.Close() })
	if err := redisFloorScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	be, err := redis.NewSharded([]redis.Shard{{Primary: c}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	limits := []struct {
		name string
		p    throttler.Policy
	}{
		{"fixed-window", throttler.PerSecond(1 << 40).Named("bench")},
		{"token-bucket", throttler.PerSecond(1 << 40).With(throttler.TokenBucket).Named("bench")},
		{"sliding-window", throttler.PerSecond(1 << 40).With(throttler.SlidingWindow).Named("bench")},
		{"sliding-log-100", throttler.Policy{Name: "bench100", Limit: 100, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}},
		{"sliding-log-10000", throttler.Policy{Name: "bench10k", Limit: throttler.MaxLogLimit, Window: 10 * time.Second, Algorithm: throttler.SlidingLog}},
	}
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	key := strconv.FormatInt(time.Now().UnixNano(), 36)
	floor := time.Duration(0)
	took := make([]time.Duration, len(limits))
	n := 0
	for b.Loop() {
		now := start.Add(time.Duration(n) * time.Millisecond)
		n++
		t0 := time.Now()
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + key}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(t0)
		for i, l := range limits {
			t0 := time.Now()
			d, err := be.Take(ctx, key, l.p, 1, now)
			took[i] += time.Since(t0)
			if err != nil || !d.Allowed {
				b.Fatalf("%s: %+v, %v", l.name, d, err)
			}
		}
	}
	b.ReportMetric(float64(floor.Nanoseconds())/float64(n), "floor-ns/call")
	for i, l := range limits {
		b.ReportMetric(float64(took[i].Nanoseconds())/float64(n), l.name+"-ns/call")
		b.ReportMetric(float64(took[i])/float64(floor), l.name+"/floor")
	}
}

package benchmarks

import (
	"context"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRedisCompositeTakePaired compares, at one goroutine, a Take of
// a composite of two policies (throttler.All: one script, one round trip)
// with a Take of one policy, the way BenchmarkRedisTakeLatencyPaired pairs
// its variants: one call of each per iteration, so that all see the same
// machine. The composites are two fixed windows (a per-second and a
// per-hour limit) and a fixed window beside a token bucket; every call is
// admitted. It reports each one's mean (ns/call) and the composites'
// ratios to the single Take.
func BenchmarkRedisCompositeTakePaired(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 1})
	b.Cleanup(func() { _ = c.Close() })
	be := redisBackend(b, c, nil)
	one := throttler.Policy{Name: "bench-h", Limit: 1 << 40, Window: time.Hour}
	two := throttler.All(throttler.Policy{Name: "bench-s", Limit: 1 << 40, Window: time.Second}, one)
	mixed := throttler.All(one, throttler.Policy{Name: "bench-tb", Limit: 1 << 30, Window: time.Second,
		Algorithm: throttler.TokenBucket})
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	variants := []struct {
		key string
		p   throttler.Policy
	}{{"one:" + run, one}, {"two:" + run, two}, {"mixed:" + run, mixed}}
	var took [3]time.Duration
	for _, v := range variants { // scripts loaded before the loop
		if _, err := be.Take(ctx, v.key, v.p, 1, now); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		for i, v := range variants {
			start := time.Now()
			if d, err := be.Take(ctx, v.key, v.p, 1, now); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			took[i] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "take-ns/call")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "all2-ns/call")
	b.ReportMetric(float64(took[2].Nanoseconds())/n, "all-fw-tb-ns/call")
	b.ReportMetric(float64(took[1])/float64(took[0]), "all2/take")
	b.ReportMetric(float64(took[2])/float64(took[0]), "all-fw-tb/take")
}

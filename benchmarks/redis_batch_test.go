package benchmarks

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// The Redis batching benchmarks (docs/performance.md, "Batching" under
// "Redis"). Every comparison is paired: each iteration is one
// round in which every variant runs for batchBurst in turn, so that all see
// the same machine; run them with -benchtime Nx (N rounds). throttlekit is
// the Backend as built by default (batching on), on a plain client;
// redis_rate/v10 runs on the same plain client and on go-redis's
// AutoPipeliner; the floor is a bare EVALSHA of INCRBY+PEXPIREAT per call.

const batchBurst = 100 * time.Millisecond

// batchVariant is one contender: f makes one call for goroutine g's i-th
// call.
type batchVariant struct {
	name string
	f    func(g, i int) error
}

// batchRun runs f on the given number of goroutines for batchBurst and
// returns the calls made and each call's latency.
func batchRun(b *testing.B, goroutines int, f func(g, i int) error) (int64, []time.Duration) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	lat := make([][]time.Duration, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				if err := f(g, i); err != nil {
					b.Error(err)
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
			}
		}()
	}
	time.Sleep(batchBurst)
	close(stop)
	wg.Wait()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	return int64(len(all)), all
}

// batchPaired runs the variants round after round, each round starting
// with the next one, and reports each one's
// calls/s, p50 and p99 (µs, over every call of every round); it returns
// the calls/s. With srv, the client on the server, it also reports each
// variant's CPU time per call in this process (client-µs/call: our code,
// go-redis and the harness) and in the server (redis-µs/call, INFO cpu), to
// tell which side saturates.
func batchPaired(b *testing.B, goroutines int, variants []batchVariant, latencies bool, srv *goredis.Client) []float64 {
	calls := make([]int64, len(variants))
	lats := make([][]time.Duration, len(variants))
	clientCPU := make([]time.Duration, len(variants))
	serverCPU := make([]time.Duration, len(variants))
	var elapsed time.Duration
	for round := 0; b.Loop(); round++ {
		// Each round starts with the next variant: going first costs
		// (measured up to 2x at low concurrency on a loaded machine).
		for k := range variants {
			i := (round + k) % len(variants)
			var c0, s0 time.Duration
			if srv != nil {
				c0, s0 = cputime.Process(), redisCPU(b, srv)
			}
			n, lat := batchRun(b, goroutines, variants[i].f)
			if srv != nil {
				clientCPU[i] += cputime.Process() - c0
				serverCPU[i] += redisCPU(b, srv) - s0
			}
			calls[i] += n
			lats[i] = append(lats[i], lat...)
		}
		elapsed += batchBurst
	}
	perSec := make([]float64, len(variants))
	for i, v := range variants {
		perSec[i] = float64(calls[i]) / elapsed.Seconds()
		b.ReportMetric(perSec[i], v.name+"-calls/s")
		if srv != nil && calls[i] > 0 {
			b.ReportMetric(float64(clientCPU[i].Nanoseconds())/1e3/float64(calls[i]), v.name+"-client-µs/call")
			b.ReportMetric(float64(serverCPU[i].Nanoseconds())/1e3/float64(calls[i]), v.name+"-redis-µs/call")
		}
		if latencies && len(lats[i]) > 0 {
			slices.Sort(lats[i])
			q := func(f float64) float64 {
				return float64(lats[i][int(f*float64(len(lats[i])-1))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(q(0.5), v.name+"-p50-µs")
			b.ReportMetric(q(0.99), v.name+"-p99-µs")
		}
	}
	return perSec
}

// redisCPU is the CPU time the server has used (INFO cpu, user + system).
func redisCPU(b *testing.B, c *goredis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * 1e9)
}

// batchSetup starts a server and returns a plain client on it (a pool as
// large as the most goroutines), an AutoPipeliner on that client, and the
// default backend on the plain client.
func batchSetup(b *testing.B, opts *redis.Options) (*goredis.Client, *goredis.AutoPipeliner, *redis.Backend) {
	addr := redisServe(b)
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 256})
	b.Cleanup(func() { _ = c.Close() })
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	if err := redisFloorScript.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	return c, ap, redisBackend(b, c, opts)
}

// batchKey is the key of goroutine g's i-th call among keys keys.
func batchKey(prefix string, keys, g, i, goroutines int) string {
	if keys == 1 {
		return prefix
	}
	return prefix + strconv.Itoa((g+i*goroutines)%keys)
}

var (
	batchNow    = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	batchPolicy = throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	batchRate   = redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}
)

// batchVariants are throttlekit, redis_rate plain and pipelined, and, with
// floor, the bare EVALSHA; every call admitted.
func batchVariants(b *testing.B, c *goredis.Client, ap *goredis.AutoPipeliner, tk *redis.Backend, keys, goroutines int, floor bool) []batchVariant {
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	rate, rateAP := redis_rate.NewLimiter(c), redis_rate.NewLimiter(ap)
	reset := strconv.FormatInt(batchNow.Add(time.Hour).UnixMilli(), 10)
	vs := []batchVariant{
		{"throttlekit", func(g, i int) error {
			d, err := tk.Take(ctx, batchKey("tk:"+run, keys, g, i, goroutines), batchPolicy, 1, batchNow)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
			return err
		}},
		{"redis_rate", func(g, i int) error {
			res, err := rate.Allow(ctx, batchKey("rr:"+run, keys, g, i, goroutines), batchRate)
			if err == nil && res.Allowed == 0 {
				err = fmt.Errorf("denied: %+v", res)
			}
			return err
		}},
		{"redis_rate-autopipeline", func(g, i int) error {
			res, err := rateAP.Allow(ctx, batchKey("ra:"+run, keys, g, i, goroutines), batchRate)
			if err == nil && res.Allowed == 0 {
				err = fmt.Errorf("denied: %+v", res)
			}
			return err
		}},
	}
	if floor {
		vs = append(vs, batchVariant{"floor", func(g, i int) error {
			return redisFloorScript.EvalSha(ctx, c, []string{batchKey("fl:"+run, keys, g, i, goroutines)}, 1, reset).Err()
		}})
	}
	return vs
}

// BenchmarkRedisBatchThroughput: Take at 64 goroutines, hot key and 10k
// keys, against redis_rate plain and pipelined and the floor. Targets:
// throttlekit at least 3x redis_rate plain and 1.3x redis_rate pipelined.
func BenchmarkRedisBatchThroughput(b *testing.B) {
	const goroutines = 64
	c, ap, tk := batchSetup(b, nil)
	for _, keys := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			perSec := batchPaired(b, goroutines, batchVariants(b, c, ap, tk, keys, goroutines, true), true, c)
			b.ReportMetric(perSec[0]/perSec[1], "throttlekit/redis_rate")
			b.ReportMetric(perSec[0]/perSec[2], "throttlekit/redis_rate-autopipeline")
			b.ReportMetric(perSec[0]/perSec[3], "throttlekit/floor")
		})
	}
}

// BenchmarkRedisBatchLatency: one goroutine, one call of the floor and one
// Take per iteration, timed apart. Target: Take at most 1.2x the floor.
func BenchmarkRedisBatchLatency(b *testing.B) {
	c, _, tk := batchSetup(b, nil)
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	reset := strconv.FormatInt(batchNow.Add(time.Hour).UnixMilli(), 10)
	var floor, take []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + run}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if d, err := tk.Take(ctx, "take:"+run, batchPolicy, 1, batchNow); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		t2 := time.Now()
		floor, take = append(floor, t1.Sub(t0)), append(take, t2.Sub(t1))
	}
	sum := func(d []time.Duration) (s time.Duration) {
		for _, x := range d {
			s += x
		}
		return s
	}
	q := func(d []time.Duration, f float64) float64 {
		slices.Sort(d)
		return float64(d[int(f*float64(len(d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(float64(sum(take))/float64(sum(floor)), "take/floor")
	b.ReportMetric(q(floor, 0.5), "floor-p50-µs")
	b.ReportMetric(q(take, 0.5), "take-p50-µs")
	b.ReportMetric(q(floor, 0.99), "floor-p99-µs")
	b.ReportMetric(q(take, 0.99), "take-p99-µs")
}

// BenchmarkRedisOverLimitCache: 64 goroutines on one key far over its
// limit (10 per hour: every call but the first ten denied), the over-limit
// cache on and off. Target: on at least 10x the calls/s of off.
func BenchmarkRedisOverLimitCache(b *testing.B) {
	const goroutines = 64
	c, _, off := batchSetup(b, nil)
	on := redisBackend(b, c, &redis.Options{OverLimitCache: 1024})
	ctx := context.Background()
	p := throttler.Policy{Name: "hot", Limit: 10, Window: time.Hour}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	take := func(be *redis.Backend, key string) func(g, i int) error {
		return func(g, i int) error {
			_, err := be.Take(ctx, key, p, 1, batchNow)
			return err
		}
	}
	perSec := batchPaired(b, goroutines, []batchVariant{
		{"cache-on", take(on, "on:"+run)},
		{"cache-off", take(off, "off:"+run)},
	}, true, nil)
	b.ReportMetric(perSec[0]/perSec[1], "on/off")
	s := on.Stats()
	b.ReportMetric(float64(s.CacheHits)/float64(s.CacheHits+s.Ops), "hit-ratio")
}

// BenchmarkRedisBatchScaling: calls/s against goroutines for throttlekit
// and redis_rate plain and pipelined, 10k keys; cmd/chart draws it
// (docs/redis-batching.svg).
func BenchmarkRedisBatchScaling(b *testing.B) {
	c, ap, tk := batchSetup(b, nil)
	for _, goroutines := range []int{1, 2, 4, 8, 16, 32, 64, 128, 256} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			perSec := batchPaired(b, goroutines, batchVariants(b, c, ap, tk, 10_000, goroutines, false), false, nil)
			b.ReportMetric(perSec[0]/perSec[1], "throttlekit/redis_rate")
			b.ReportMetric(perSec[0]/perSec[2], "throttlekit/redis_rate-autopipeline")
		})
	}
}

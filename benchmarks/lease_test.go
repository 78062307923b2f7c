package benchmarks

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// Leases: what one request pays for a concurrency limit, an
// Acquire and its Release.

// BenchmarkLeaseMemory times an Acquire and its Release (one op) on one key
// of the memory backend, with held other leases held throughout as a live
// key has, and reports the thread's CPU time per op beside ns/op (a shared
// machine's load moves ns/op by 2x). The target: under 200 ns and
// no allocation.
func BenchmarkLeaseMemory(b *testing.B) {
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, held := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			m, err := memory.New(nil)
			if err != nil {
				b.Fatal(err)
			}
			p := throttler.ConcurrencyPolicy{Name: "bench", Limit: int64(held) + 1, TTL: time.Minute}
			for id := range held {
				if d, err := m.Acquire(ctx, "hot", p, throttler.LeaseID(id+1), now); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			start, n := cputime.Thread(), 0
			for b.Loop() {
				n++
				id := throttler.LeaseID(1_000_000 + n)
				d, err := m.Acquire(ctx, "hot", p, id, now)
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				if held, _, err := m.Release(ctx, "hot", p, id, now); err != nil || !held {
					b.Fatal(held, err)
				}
			}
			if cputime.Supported {
				b.ReportMetric(float64(cputime.Thread()-start)/float64(n), "cpu-ns/op")
			}
		})
	}
}

// BenchmarkRedisLeasePaired measures, on 1 goroutine, an Acquire and a
// Release each against the one-round-trip floor (a bare EVALSHA of
// INCRBY+PEXPIREAT), in one loop: per iteration a floor call, an Acquire
// of a new lease and its Release (the floor in each place in turn), on a
// key that holds held other leases.
// The clock moves 1 ms per iteration; no lease expires. It reports each
// one's mean (ns/call) and its ratio to the floor; the target is
// 1.2x for each.
func BenchmarkRedisLeasePaired(b *testing.B) {
	for _, held := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			addr := redisServe(b)
			ctx := context.Background()
			c := redisAlgClient(b, addr, 1)
			be, err := redis.NewSharded([]redis.Shard{{Primary: c}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			key := strconv.FormatInt(time.Now().UnixNano(), 36)
			p := throttler.ConcurrencyPolicy{Name: "bench", Limit: int64(held) + 1, TTL: time.Hour}
			for id := range held {
				if d, err := be.Acquire(ctx, key, p, throttler.LeaseID(id+1), start); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
			var floor, acquire, release time.Duration
			n := 0
			for b.Loop() {
				now := start.Add(time.Duration(n) * time.Millisecond)
				n++
				id := throttler.LeaseID(1_000_000 + n)
				// The floor takes each place in turn: before the
				// Acquire, between it and the Release, after both.
				for step := range 3 {
					t0 := time.Now()
					switch {
					case step == n%3:
						if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + key}, 1, reset).Err(); err != nil {
							b.Fatal(err)
						}
						floor += time.Since(t0)
					case step < n%3 && step == 0 || step > n%3 && step == 1:
						if d, err := be.Acquire(ctx, key, p, id, now); err != nil || !d.Allowed {
							b.Fatal(d, err)
						}
						acquire += time.Since(t0)
					default:
						if ok, _, err := be.Release(ctx, key, p, id, now); err != nil || !ok {
							b.Fatal(ok, err)
						}
						release += time.Since(t0)
					}
				}
			}
			b.ReportMetric(float64(floor.Nanoseconds())/float64(n), "floor-ns/call")
			b.ReportMetric(float64(acquire.Nanoseconds())/float64(n), "acquire-ns/call")
			b.ReportMetric(float64(release.Nanoseconds())/float64(n), "release-ns/call")
			b.ReportMetric(float64(acquire)/float64(floor), "acquire/floor")
			b.ReportMetric(float64(release)/float64(floor), "release/floor")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRedisLeaseServerTime reports the server's own time per call of
// the floor, acquire.lua and release.lua, from SLOWLOG with every command
// logged, interleaved one call of each per iteration on one server, on a
// key holding 10 other leases: the mean of the fastest 90% of each one's
// calls, in µs (as BenchmarkRedisAlgorithmsServerTime).
func BenchmarkRedisLeaseServerTime(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	c := redisAlgClient(b, addr, 1)
	be := redisBackend(b, c, nil)
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	p := throttler.ConcurrencyPolicy{Name: "bench", Limit: 11, TTL: time.Hour}
	for id := range 10 {
		if d, err := be.Acquire(ctx, "lease", p, throttler.LeaseID(id+1), start); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	slowLogAll(b, ctx, c)
	n := 0
	for b.Loop() {
		now := start.Add(time.Duration(n) * time.Millisecond)
		n++
		id := throttler.LeaseID(1_000_000 + n)
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor"}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		if d, err := be.Acquire(ctx, "lease", p, id, now); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		if ok, _, err := be.Release(ctx, "lease", p, id, now); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	b.StopTimer()
	// The floor by its key; the lease scripts by their argument count
	// (acquire.lua has 5, release.lua 2).
	reportScriptServerTime(b, ctx, c, []string{"floor", "acquire", "release"}, func(args []string) string {
		switch {
		case args[3] == "floor":
			return "floor"
		case len(args) == 4+5:
			return "acquire"
		case len(args) == 4+2:
			return "release"
		}
		return ""
	})
	b.ReportMetric(0, "ns/op")
}

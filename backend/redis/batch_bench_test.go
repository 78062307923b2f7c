package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkBatching compares batching on and off (MaxBatch 1, one round
// trip per call as on a plain client) and other rules for the round trips
// a lane runs at once, on a fixed window, at several goroutine counts on
// one client. Each iteration is one round in which each design runs for
// 100 ms in turn, so all see the same machine; run it with -benchtime Nx.
// It reports calls/s, the server's time per operation (INFO
// commandstats) and the ratios to the default. At commit 2f3c06f it also
// measured a batch as one script call running every operation, against
// the pipeline of EVALSHAs kept.
func BenchmarkBatching(b *testing.B) {
	rdb, port := startRedis(b)
	_ = rdb
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), PoolSize: 256, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	now := t0
	for _, goroutines := range []int{2, 4, 8, 64} {
		for _, keys := range []int{1, 10_000} {
			if keys == 1 && goroutines < 64 {
				continue
			}
			b.Run(fmt.Sprintf("goroutines=%d/keys=%d", goroutines, keys), func(b *testing.B) {
				p := throttler.Policy{Name: "bench", Limit: 1 << 30, Window: time.Hour}
				on := newBackend(b, c, &Options{Prefix: "on:"})
				off := newBackend(b, c, &Options{Prefix: "off:", MaxBatch: 1})
				// Before this commit: two round trips at once.
				two := newBackend(b, c, &Options{Prefix: "two:"})
				two.shards[0].primaryLane.slots = 2
				// One batch at once instead of two.
				one := newBackend(b, c, &Options{Prefix: "batches1:"})
				one.shards[0].primaryLane.batches = 1
				// A takes.lua call per window, not per batch.
				apart := newBackend(b, c, &Options{Prefix: "apart:"})
				apart.shards[0].primaryLane.one = false
				designs := []struct {
					name string
					b    *Backend
				}{{"batched", on}, {"unbatched", off}, {"inflight2", two}, {"batches1", one}, {"apart", apart}}
				calls := make([]int64, len(designs))
				usec := make([]int64, len(designs))
				const burst = 100 * time.Millisecond
				var elapsed time.Duration
				for round := 0; b.Loop(); round++ {
					for k := range designs {
						// Each round starts with the next design: going
						// first costs, up to 2x at low concurrency here.
						i := (round + k) % len(designs)
						d := designs[i]
						if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
							b.Fatal(err)
						}
						var n atomic.Int64
						var wg sync.WaitGroup
						stop := make(chan struct{})
						for g := range goroutines {
							wg.Add(1)
							go func() {
								defer wg.Done()
								for j := g; ; j += goroutines {
									select {
									case <-stop:
										return
									default:
									}
									if _, err := d.b.Take(context.Background(), strconv.Itoa(j%keys), p, 1, now); err != nil {
										b.Error(err)
										return
									}
									n.Add(1)
								}
							}()
						}
						time.Sleep(burst)
						close(stop)
						wg.Wait()
						calls[i] += n.Load()
						usec[i] += serverUsec(b, c)
					}
					elapsed += burst
				}
				for i, d := range designs {
					b.ReportMetric(float64(calls[i])/elapsed.Seconds(), d.name+"-calls/s")
				}
				for i, d := range designs {
					b.ReportMetric(float64(usec[i])/float64(calls[i]), d.name+"-server-µs/op")
				}
				for i, d := range designs[1:] {
					b.ReportMetric(float64(calls[0])/float64(calls[i+1]), "batched/"+d.name)
				}
			})
		}
	}
}

// serverUsec is the server's time in commands since its stats were reset
// (INFO commandstats, all commands).
func serverUsec(b *testing.B, c *goredis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_info") || strings.HasPrefix(line, "cmdstat_config") {
			continue
		}
		for _, f := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				total += n
			}
		}
	}
	return total
}

// BenchmarkTakesScript measures the server's time per Take (INFO
// commandstats) of a batch of 128 Takes of distinct existing windows:
// sent as a pipeline of take.lua calls, as one takes.lua call, and, for
// comparison, as a pipeline of the commands take.lua runs (HMGET,
// HINCRBY), without a script. It is what bounds Takes of distinct keys
// once batched.
func BenchmarkTakesScript(b *testing.B) {
	rdb, _ := startRedis(b)
	ctx := context.Background()
	const n = 128
	keys := make([]string, n)
	nowMS := t0.UnixMilli()
	one := []any{nowMS, nowMS + 3_600_000, int64(1) << 40, 1, 3_600_001}
	// takes.lua's arguments: one parameter set, then each window's one
	// Take of it, cost 1.
	multi := append(make([]any, 0, 5+3*n), 1, one[0], one[1], one[2], one[4])
	for i := range keys {
		keys[i] = "ts:" + strconv.Itoa(i)
		multi = append(multi, 1, 1, 1)
	}
	if err := takeScript.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	if err := takesScript.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	designs := []struct {
		name string
		f    func(pipe goredis.Pipeliner)
	}{
		{"take.lua", func(pipe goredis.Pipeliner) {
			for _, k := range keys {
				takeScript.EvalSha(ctx, pipe, []string{k}, one...)
			}
		}},
		{"takes.lua", func(pipe goredis.Pipeliner) {
			takesScript.EvalSha(ctx, pipe, keys, multi...)
		}},
		{"commands", func(pipe goredis.Pipeliner) {
			for _, k := range keys {
				pipe.HMGet(ctx, k, "u", "r")
				pipe.HIncrBy(ctx, k, "u", 1)
			}
		}},
	}
	usec := make([]int64, len(designs))
	for b.Loop() {
		for i, d := range designs {
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			for range 20 {
				pipe := rdb.Pipeline()
				d.f(pipe)
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			usec[i] += serverUsec(b, rdb)
		}
	}
	for i, d := range designs {
		b.ReportMetric(float64(usec[i])/float64(20*n*b.N), d.name+"-server-µs/take")
	}
}

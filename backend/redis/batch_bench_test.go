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

// BenchmarkBatching compares batching on and off (MaxBatch 1) at 64
// goroutines on one client. Each iteration is one round in which each runs
// for 100 ms in turn, so both see the same machine; run it with
// -benchtime Nx. It reports calls/s, the server's time per operation
// (INFO commandstats) and the ratio. At commit 2f3c06f it also measured a
// batch as one script call running every operation, against the pipeline
// of EVALSHAs kept.
func BenchmarkBatching(b *testing.B) {
	rdb, port := startRedis(b)
	_ = rdb
	const goroutines = 64
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), PoolSize: goroutines, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	now := t0
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket} {
		for _, keys := range []int{1, 10_000} {
			b.Run(fmt.Sprintf("%v/keys=%d", alg, keys), func(b *testing.B) {
				p := throttler.Policy{Name: "bench", Limit: 1 << 30, Window: time.Hour, Algorithm: alg}
				on := newBackend(b, c, &Options{Prefix: "on:"})
				one := newBackend(b, c, &Options{Prefix: "one:"})
				one.shards[0].primaryLane.slots = 1
				four := newBackend(b, c, &Options{Prefix: "four:"})
				four.shards[0].primaryLane.slots = 4
				off := newBackend(b, c, &Options{Prefix: "off:", MaxBatch: 1})
				designs := []struct {
					name string
					b    *Backend
				}{{"batched", on}, {"unbatched", off}, {"inflight1", one}, {"inflight4", four}}
				calls := make([]int64, len(designs))
				usec := make([]int64, len(designs))
				const burst = 100 * time.Millisecond
				var elapsed time.Duration
				for b.Loop() {
					for i, d := range designs {
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
				b.ReportMetric(float64(calls[0])/float64(calls[1]), "batched/unbatched")
				b.ReportMetric(float64(calls[2])/float64(calls[0]), "inflight1/batched")
				b.ReportMetric(float64(calls[3])/float64(calls[0]), "inflight4/batched")
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

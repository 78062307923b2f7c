package benchmarks

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRedisWaitPaired measures what Options.WaitReplicas costs: Take
// by default and with WaitReplicas 1 (WAIT after each write, in its
// pipeline), on a primary with one replica attached, both on loopback. As
// in BenchmarkRedisThroughputPaired, each iteration is a round in which
// each variant runs for redisBurst in turn, on 1 goroutine and on 64 (each
// goroutine on its own key, every call admitted), so that both see the
// same machine. It reports each variant's calls/s and the WAIT variant's
// share of the default's; run it with -benchtime=Nx (N rounds).
func BenchmarkRedisWaitPaired(b *testing.B) {
	// Diskless sync at once: the replica is in sync within serve's 5s. Each
	// server works in a directory of its own: a replica writes the data set
	// it receives to disk.
	primary := serve(b, "redis-server", func(p string) []string {
		return []string{"--bind", "127.0.0.1", "--port", p, "--save", "", "--appendonly", "no",
			"--repl-diskless-sync-delay", "0", "--dir", b.TempDir()}
	}, func(addr string) error {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		return c.Ping(context.Background()).Err()
	})
	_, port, _ := strings.Cut(primary, ":")
	serve(b, "redis-server", func(p string) []string {
		return []string{"--bind", "127.0.0.1", "--port", p, "--save", "", "--appendonly", "no",
			"--replicaof", "127.0.0.1", port, "--dir", b.TempDir()}
	}, func(addr string) error {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && !strings.Contains(info, "master_link_status:up") {
			err = fmt.Errorf("replica of %s not in sync", primary)
		}
		return err
	})
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	for _, goroutines := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			c := goredis.NewClient(&goredis.Options{Addr: primary, ContextTimeoutEnabled: true, PoolSize: goroutines})
			b.Cleanup(func() { _ = c.Close() })
			def, wait := redisBackend(b, c, nil), redisBackend(b, c, &redis.Options{WaitReplicas: 1})
			take := func(be *redis.Backend) func(key string) error {
				return func(key string) error {
					d, err := be.Take(ctx, key, p, 1, now)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					return err
				}
			}
			perSec := redisRounds(b, goroutines, []redisVariant{{"default", take(def)}, {"wait1", take(wait)}})
			b.ReportMetric(perSec[1]/perSec[0], "wait1/default")
		})
	}
}

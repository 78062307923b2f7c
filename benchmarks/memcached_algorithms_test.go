package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// memcachedAlgorithms are the policies of the algorithm benchmarks: every
// Take is admitted. The log's clock moves 1 ms per call, so it holds about
// 100 live entries (its state is then about 250 bytes), as a log in steady
// use would; the bucket and the counter run at one instant.
var memcachedAlgorithms = []struct {
	name string
	p    throttler.Policy
	step time.Duration // how far now moves per call
}{
	{"token-bucket", throttler.Policy{Name: "bench", Limit: 1 << 30, Window: time.Hour, Algorithm: throttler.TokenBucket}, 0},
	{"sliding-log", throttler.Policy{Name: "bench", Limit: throttler.MaxLogLimit, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}, time.Millisecond},
	{"sliding-window", throttler.Policy{Name: "bench", Limit: 1 << 30, Window: time.Hour, Algorithm: throttler.SlidingWindow}, 0},
}

// lostCounter counts the cas and add calls that lost to another writer:
// each is one more round of a Take.
type lostCounter struct {
	*memcache.Client
	lost atomic.Int64
}

func (c *lostCounter) CompareAndSwap(it *memcache.Item) error {
	err := c.Client.CompareAndSwap(it)
	if errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCacheMiss) {
		c.lost.Add(1)
	}
	return err
}

func (c *lostCounter) Add(it *memcache.Item) error {
	err := c.Client.Add(it)
	if errors.Is(err, memcache.ErrNotStored) {
		c.lost.Add(1)
	}
	return err
}

// BenchmarkMemcachedAlgorithmTake compares an admitted Take of each
// algorithm (gets, then cas: two round trips) with the floor, a bare
// Increment on the same server and client, timed apart within each
// iteration as in BenchmarkMemcachedTake. "own-key" gives each goroutine a
// key of its own (no contention); "one-key" runs 64 goroutines on one key
// and reports retries per admitted Take (lost cas or add).
func BenchmarkMemcachedAlgorithmTake(b *testing.B) {
	addr := memcachedServe(b)
	for _, alg := range memcachedAlgorithms {
		for _, shape := range []struct {
			name       string
			goroutines int
			shared     bool
		}{{"own-key/goroutines=1", 1, false}, {"one-key/goroutines=64", 64, true}} {
			b.Run(alg.name+"/"+shape.name, func(b *testing.B) {
				mc := memcache.New(addr)
				mc.Timeout = 5 * time.Second
				mc.MaxIdleConns = shape.goroutines
				b.Cleanup(func() { _ = mc.Close() })
				c := &lostCounter{Client: mc}
				m, err := memcached.New(c, nil)
				if err != nil {
					b.Fatal(err)
				}
				base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
				ctx := context.Background()
				var id, clock atomic.Int64
				var takeNs, floorNs atomic.Int64
				memcachedRun(b, shape.goroutines, func() func() error {
					n := strconv.FormatInt(id.Add(1), 10)
					key, floorKey := alg.name+"-"+n, "bench:floor:"+alg.name+"-"+n
					if shape.shared {
						key = alg.name + "-shared"
					}
					if err := mc.Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
						b.Fatal(err)
					}
					var local int64
					return func() error {
						tick := &local
						if shape.shared {
							tick = new(int64)
							*tick = clock.Add(1)
						} else {
							local++
						}
						now := base.Add(time.Duration(*tick) * alg.step)
						t0 := time.Now()
						if _, err := mc.Increment(floorKey, 1); err != nil {
							return err
						}
						t1 := time.Now()
						d, err := m.Take(ctx, key, alg.p, 1, now)
						t2 := time.Now()
						if err == nil && !d.Allowed {
							err = fmt.Errorf("denied: %+v", d)
						}
						floorNs.Add(int64(t1.Sub(t0)))
						takeNs.Add(int64(t2.Sub(t1)))
						return err
					}
				})
				take, floor := float64(takeNs.Load())/float64(b.N), float64(floorNs.Load())/float64(b.N)
				b.ReportMetric(take, "take-ns/op")
				b.ReportMetric(floor, "floor-ns/op")
				b.ReportMetric(take/floor, "x-floor")
				b.ReportMetric(float64(c.lost.Load())/float64(b.N), "retries/take")
			})
		}
	}
}

package benchmarks

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// memcachedServe starts the memcached binary on a free loopback port and
// returns its address; the server is killed when the benchmark ends. It
// skips the benchmark when memcached is not installed.
func memcachedServe(b *testing.B) string {
	b.Helper()
	return serve(b, "memcached", func(port string) []string {
		// -t 1: one worker thread, as the machine has 2 cores for the server and the
		// benchmark.
		return []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "64", "-t", "1", "-c", "1024", "-u", "root"}
	}, func(addr string) error {
		c := memcache.New(addr)
		defer c.Close()
		return c.Ping()
	})
}

// BenchmarkMemcachedTake compares Backend.Take in an open window with the
// floor, a bare gomemcache Increment on the same server and client, on 1
// goroutine and on 64: "take" is the default (the head's reset-at cached, so
// one incr), "take-nocache" reads the head on every call (gets + incr).
//
// Each iteration makes one Increment and one Take, timed apart, so both see
// the same load: on a shared 2-core machine the load moves between
// sub-benchmarks, and a ratio of two separate runs would measure that.
// Reported: take-ns/op, floor-ns/op and x-floor, their ratio (ns/op is the
// pair).
func BenchmarkMemcachedTake(b *testing.B) {
	addr := memcachedServe(b)
	for _, mode := range []struct {
		name string
		opts *memcached.Options
	}{{"take", nil}, {"take-nocache", &memcached.Options{NoCache: true}}} {
		for _, goroutines := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", mode.name, goroutines), func(b *testing.B) {
				c := memcache.New(addr)
				c.Timeout = 5 * time.Second // 64 goroutines queue on a loaded 2-core machine
				c.MaxIdleConns = goroutines
				b.Cleanup(func() { _ = c.Close() })
				m, err := memcached.New(c, mode.opts)
				if err != nil {
					b.Fatal(err)
				}
				// Every call is admitted: the benchmark measures counting in an
				// open window.
				p := throttler.Policy{Name: "bench", Limit: memcached.MaxLimit, Window: time.Hour}
				now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
				ctx := context.Background()
				var id atomic.Int64
				var takeNs, floorNs atomic.Int64
				memcachedRun(b, goroutines, func() func() error {
					// Each goroutine has its own key and floor item: the
					// two sides contend alike.
					n := strconv.FormatInt(id.Add(1), 10)
					key, floorKey := mode.name+"-"+n, "bench:floor:"+mode.name+"-"+n
					if err := c.Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
						b.Fatal(err)
					}
					return func() error {
						t0 := time.Now()
						if _, err := c.Increment(floorKey, 1); err != nil {
							return err
						}
						t1 := time.Now()
						d, err := m.Take(ctx, key, p, 1, now)
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
			})
		}
	}
}

// memcachedRun calls, b.N times in all, the function that newWorker returns
// for each of the given number of goroutines.
func memcachedRun(b *testing.B, goroutines int, newWorker func() func() error) {
	b.ReportAllocs()
	if goroutines == 1 {
		f := newWorker()
		b.ResetTimer()
		for range b.N {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		f := newWorker()
		for pb.Next() {
			if err := f(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

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

// memcachedContention runs the rounds of a contention benchmark: clients
// Backends on addr, each on a client of its own, shared by goroutines
// callers. Each iteration is a round in which the floor (Increment of one
// item by the same goroutines and clients) and then op, on its goroutine's
// Backend, each run for memcachedBurst. op counts the calls that ran out
// of attempts (ErrContention, then made again) in contended. It reports
// both throughputs, the lost cas/add rounds per op ("retries/<unit>", the
// client's CompareAndSwap and Add wrapped in a lostCounter) and the
// contended calls per op.
func memcachedContention(b *testing.B, addr string, clients, goroutines int, unit string, op func(m *memcached.Backend, contended *atomic.Int64) error) {
	counters := make([]*lostCounter, clients)
	backends := make([]*memcached.Backend, clients)
	for i := range clients {
		mc := memcache.New(addr)
		mc.Timeout = 5 * time.Second // 64 goroutines queue on a loaded 2-core machine
		mc.MaxIdleConns = goroutines / clients
		b.Cleanup(func() { _ = mc.Close() })
		counters[i] = &lostCounter{Client: mc}
		m, err := memcached.New(counters[i], nil)
		if err != nil {
			b.Fatal(err)
		}
		backends[i] = m
	}
	floorKey := "bench:floor:" + unit + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := counters[0].Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
		b.Fatal(err)
	}
	var ops, floors int64
	var contended atomic.Int64
	var elapsed time.Duration
	for b.Loop() {
		floors += burst(b, goroutines, memcachedBurst, func(g, _ int) error {
			_, err := counters[g%clients].Increment(floorKey, 1)
			return err
		})
		ops += burst(b, goroutines, memcachedBurst, func(g, _ int) error {
			return op(backends[g%clients], &contended)
		})
		elapsed += memcachedBurst
	}
	var lost int64
	for _, c := range counters {
		lost += c.lost.Load()
	}
	n := float64(ops)
	b.ReportMetric(n/elapsed.Seconds(), unit+"s/s")
	b.ReportMetric(float64(floors)/elapsed.Seconds(), "floor-calls/s")
	b.ReportMetric(n/float64(floors), unit+"s/floor")
	b.ReportMetric(float64(lost)/n, "retries/"+unit)
	b.ReportMetric(float64(contended.Load())/n, "contention-errors/"+unit)
}

// BenchmarkMemcachedAlgorithmTake compares an admitted Take of each
// algorithm (gets, then cas: two round trips) on a key of its own, one
// goroutine, with the floor, a bare Increment on the same server and
// client, timed apart within each iteration as in BenchmarkMemcachedTake.
func BenchmarkMemcachedAlgorithmTake(b *testing.B) {
	addr := memcachedServe(b)
	for _, alg := range memcachedAlgorithms {
		b.Run(alg.name+"/own-key/goroutines=1", func(b *testing.B) {
			mc := memcache.New(addr)
			mc.Timeout = 5 * time.Second
			b.Cleanup(func() { _ = mc.Close() })
			m, err := memcached.New(mc, nil)
			if err != nil {
				b.Fatal(err)
			}
			base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			ctx := context.Background()
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			key, floorKey := alg.name+"-"+run, "bench:floor:"+alg.name+"-"+run
			if err := mc.Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
				b.Fatal(err)
			}
			var take, floor time.Duration
			n := 0
			for b.Loop() {
				n++
				now := base.Add(time.Duration(n) * alg.step)
				t0 := time.Now()
				if _, err := mc.Increment(floorKey, 1); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if d, err := m.Take(ctx, key, alg.p, 1, now); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				t2 := time.Now()
				floor, take = floor+t1.Sub(t0), take+t2.Sub(t1)
			}
			b.ReportMetric(float64(take.Nanoseconds())/float64(n), "take-ns/op")
			b.ReportMetric(float64(floor.Nanoseconds())/float64(n), "floor-ns/op")
			b.ReportMetric(float64(take)/float64(floor), "x-floor")
		})
	}
}

// memcachedBurst is how long each variant runs in a round of
// BenchmarkMemcachedAlgorithmContention.
const memcachedBurst = 200 * time.Millisecond

// BenchmarkMemcachedAlgorithmContention runs 64 goroutines on one key,
// every Take admitted, spread over 1 or 8 Backends, each with a client of
// its own: one Backend makes its callers of a key take turns, so its cas
// loses only to other processes, which 8 Backends stand for. Each
// iteration is a round in which the floor (Increment of one item by the
// same 64 goroutines and clients) and the Takes each run for
// memcachedBurst; run it with -benchtime=Nx (N rounds). It reports both
// throughputs, lost cas/add rounds per admitted Take, and the Takes that
// ran out of attempts (ErrContention) per admitted Take.
func BenchmarkMemcachedAlgorithmContention(b *testing.B) {
	const goroutines = 64
	addr := memcachedServe(b)
	for _, alg := range memcachedAlgorithms {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/one-key/goroutines=%d/clients=%d", alg.name, goroutines, clients), func(b *testing.B) {
				base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
				ctx := context.Background()
				key := alg.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
				var clock atomic.Int64
				memcachedContention(b, addr, clients, goroutines, "take", func(m *memcached.Backend, contended *atomic.Int64) error {
					now := base.Add(time.Duration(clock.Add(1)) * alg.step)
					d, err := m.Take(ctx, key, alg.p, 1, now)
					for errors.Is(err, memcached.ErrContention) {
						// Counted, and taken again: the call is
						// not admitted until it succeeds.
						contended.Add(1)
						d, err = m.Take(ctx, key, alg.p, 1, now)
					}
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					return err
				})
			})
		}
	}
}

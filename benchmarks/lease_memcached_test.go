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

// memcachedLeasePolicy admits every Acquire of the lease benchmarks: no
// goroutine holds more than one lease at a time, and there are at most 64.
var memcachedLeasePolicy = throttler.ConcurrencyPolicy{Name: "bench", Limit: 64, TTL: time.Minute}

// BenchmarkMemcachedLease compares an Acquire and its Release (gets and
// cas each: four round trips) on a key of its own, one goroutine, with the
// floor, a bare Increment on the same server and client, timed apart
// within each iteration as in BenchmarkMemcachedTake.
func BenchmarkMemcachedLease(b *testing.B) {
	addr := memcachedServe(b)
	mc := memcache.New(addr)
	mc.Timeout = 5 * time.Second
	b.Cleanup(func() { _ = mc.Close() })
	m, err := memcached.New(mc, nil)
	if err != nil {
		b.Fatal(err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	key, floorKey := "lease-"+run, "bench:floor:lease-"+run
	if err := mc.Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
		b.Fatal(err)
	}
	base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	b.Run("own-key/goroutines=1", func(b *testing.B) {
		var pair, floor time.Duration
		n := 0
		for b.Loop() {
			n++
			now := base.Add(time.Duration(n) * time.Millisecond)
			id := throttler.LeaseID(n)
			t0 := time.Now()
			if _, err := mc.Increment(floorKey, 1); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if d, err := m.Acquire(ctx, key, memcachedLeasePolicy, id, now); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			if held, _, err := m.Release(ctx, key, memcachedLeasePolicy, id, now); err != nil || !held {
				b.Fatal(held, err)
			}
			t2 := time.Now()
			floor, pair = floor+t1.Sub(t0), pair+t2.Sub(t1)
		}
		b.ReportMetric(float64(pair.Nanoseconds())/float64(n), "acquire+release-ns/op")
		b.ReportMetric(float64(floor.Nanoseconds())/float64(n), "floor-ns/op")
		b.ReportMetric(float64(pair)/float64(floor), "x-floor")
	})
}

// BenchmarkMemcachedLeaseContention runs 64 goroutines acquiring and
// releasing leases on one key, every Acquire admitted, spread over 1 or 8
// Backends, each with a client of its own: one Backend makes its callers
// of a key take turns, so its cas loses only to other processes, which 8
// Backends stand for. Each iteration is a round in which the floor
// (Increment of one item by the same goroutines and clients) and the
// Acquire+Release pairs each run for memcachedBurst; run it with
// -benchtime=Nx (N rounds). It reports both throughputs, the lost cas/add
// rounds per pair (the CAS retries), and the calls that ran out of
// attempts (ErrContention, then made again) per pair.
func BenchmarkMemcachedLeaseContention(b *testing.B) {
	const goroutines = 64
	addr := memcachedServe(b)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("one-key/goroutines=%d/clients=%d", goroutines, clients), func(b *testing.B) {
			base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			ctx := context.Background()
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
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			key, floorKey := "lease-"+run, "bench:floor:lease-"+run
			if err := counters[0].Set(&memcache.Item{Key: floorKey, Value: []byte("0")}); err != nil {
				b.Fatal(err)
			}
			var clock atomic.Int64
			var pairs, floors int64
			var contended atomic.Int64
			var elapsed time.Duration
			for b.Loop() {
				floors += burst(b, goroutines, memcachedBurst, func(g, _ int) error {
					_, err := counters[g%clients].Increment(floorKey, 1)
					return err
				})
				pairs += burst(b, goroutines, memcachedBurst, func(g, _ int) error {
					m := backends[g%clients]
					now := base.Add(time.Duration(clock.Add(1)) * time.Microsecond)
					id := throttler.NewLeaseID()
					d, err := m.Acquire(ctx, key, memcachedLeasePolicy, id, now)
					for errors.Is(err, memcached.ErrContention) {
						contended.Add(1)
						d, err = m.Acquire(ctx, key, memcachedLeasePolicy, id, now)
					}
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					if err != nil {
						return err
					}
					held, _, err := m.Release(ctx, key, memcachedLeasePolicy, id, now)
					for errors.Is(err, memcached.ErrContention) {
						contended.Add(1)
						held, _, err = m.Release(ctx, key, memcachedLeasePolicy, id, now)
					}
					if err == nil && !held {
						err = fmt.Errorf("lease %d not held at its release", id)
					}
					return err
				})
				elapsed += memcachedBurst
			}
			var lost int64
			for _, c := range counters {
				lost += c.lost.Load()
			}
			n := float64(pairs)
			b.ReportMetric(n/elapsed.Seconds(), "pairs/s")
			b.ReportMetric(float64(floors)/elapsed.Seconds(), "floor-calls/s")
			b.ReportMetric(n/float64(floors), "pairs/floor")
			b.ReportMetric(float64(lost)/n, "cas-retries/pair")
			b.ReportMetric(float64(contended.Load())/n, "contention-errors/pair")
		})
	}
}

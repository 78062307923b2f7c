package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
// Backends stand for. Rounds as in BenchmarkMemcachedAlgorithmContention
// (memcachedContention; run it with -benchtime=Nx, N rounds), each op an
// Acquire and its Release, either made again after ErrContention (a
// Release must be: its lease would hold a slot for the TTL).
func BenchmarkMemcachedLeaseContention(b *testing.B) {
	const goroutines = 64
	addr := memcachedServe(b)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("one-key/goroutines=%d/clients=%d", goroutines, clients), func(b *testing.B) {
			base := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			ctx := context.Background()
			key := "lease-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			var clock atomic.Int64
			memcachedContention(b, addr, clients, goroutines, "pair", func(m *memcached.Backend, contended *atomic.Int64) error {
				now := base.Add(time.Duration(clock.Add(1)) * time.Microsecond)
				id := throttler.LeaseID(rand.Uint64() | 1)
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
		})
	}
}

package benchmarks

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkMemcachedComposite compares a composite of two policies
// (throttler.All) with a Take of its first member alone, on one goroutine:
// each iteration makes one of each on keys of its own, timed apart, so both
// see the same load (see BenchmarkMemcachedTake). Reported: composite-ns/op,
// single-ns/op and x-single, their ratio (ns/op is the pair).
//
//   - fw+fw: two fixed windows, both admitting (a multi-key gets of the two
//     counters, then an incr of each), beside one fixed window's incr.
//   - fw+tb: a fixed window and a token bucket, both admitting (gets of
//     both, then the incr and the bucket's cas), beside the bucket's Take
//     alone (gets, cas).
//   - fw+fw-denied: the first window full, so the composite is denied by
//     its read alone, beside that window's denied Take (incr, decr).
func BenchmarkMemcachedComposite(b *testing.B) {
	addr := memcachedServe(b)
	open := throttler.Policy{Name: "bench-m", Limit: memcached.MaxLimit, Window: time.Hour}
	day := throttler.Policy{Name: "bench-d", Limit: memcached.MaxLimit, Window: 24 * time.Hour}
	bucket := throttler.PerHour(1 << 30).Named("bench-tb")
	full := throttler.Policy{Name: "bench-full", Limit: 1, Window: time.Hour}
	for _, tt := range []struct {
		name          string
		single, other throttler.Policy
		admitted      bool
	}{
		{"fw+fw", open, day, true},
		{"fw+tb", bucket, open, true},
		{"fw+fw-denied", full, day, false},
	} {
		b.Run(tt.name, func(b *testing.B) {
			c := memcache.New(addr)
			c.Timeout = 5 * time.Second
			b.Cleanup(func() { _ = c.Close() })
			m, err := memcached.New(c, nil)
			if err != nil {
				b.Fatal(err)
			}
			all := throttler.All(tt.single, tt.other)
			now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			ctx := context.Background()
			var id atomic.Int64
			var allNs, singleNs atomic.Int64
			memcachedRun(b, 1, func() func() error {
				n := strconv.FormatInt(id.Add(1), 10)
				key, singleKey := tt.name+"-all-"+n, tt.name+"-one-"+n
				if !tt.admitted {
					// Fill the first member on both keys.
					for _, k := range []string{key, singleKey} {
						if _, err := m.Take(ctx, k, tt.single, 1, now); err != nil {
							b.Fatal(err)
						}
					}
				}
				return func() error {
					t0 := time.Now()
					d1, err := m.Take(ctx, singleKey, tt.single, 1, now)
					t1 := time.Now()
					if err != nil {
						return err
					}
					d2, err := m.Take(ctx, key, all, 1, now)
					t2 := time.Now()
					if err == nil && (d1.Allowed != tt.admitted || d2.Allowed != tt.admitted) {
						err = fmt.Errorf("admitted %v and %v, want %v", d1.Allowed, d2.Allowed, tt.admitted)
					}
					singleNs.Add(int64(t1.Sub(t0)))
					allNs.Add(int64(t2.Sub(t1)))
					return err
				}
			})
			composite, single := float64(allNs.Load())/float64(b.N), float64(singleNs.Load())/float64(b.N)
			b.ReportMetric(composite, "composite-ns/op")
			b.ReportMetric(single, "single-ns/op")
			b.ReportMetric(composite/single, "x-single")
		})
	}
}

package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkAllow is what the Throttler adds to a backend call: the clock,
// the per-call timeout's context, the breaker and the decision's path.
func BenchmarkAllow(b *testing.B) {
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	ctx := context.Background()
	m := newMemory(b)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Run("backend", func(b *testing.B) {
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := m.Take(ctx, "client", p, 1, now); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
	b.Run("throttler", func(b *testing.B) {
		th := newThrottler(b, m, nil)
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", p); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
	b.Run("remote", func(b *testing.B) { // a backend called under the Timeout's context
		th := newThrottler(b, remote{m}, nil)
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", p); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
	b.Run("observed", func(b *testing.B) {
		var seen int
		th := newThrottler(b, m, &throttler.Options{Observe: func(throttler.Observation) { seen++ }})
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", p); err != nil {
				b.Fatal(err)
			}
		}
		report()
		if seen == 0 {
			b.Fatal("nothing observed")
		}
	})
	b.Run("unnamed", func(b *testing.B) { // the identity is built from the definition
		th := newThrottler(b, m, nil)
		unnamed := throttler.Policy{Limit: 1 << 40, Window: time.Hour}
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", unnamed); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
}

// remote hides the memory backend's InProcess, as a network backend has
// none: its calls get the Timeout's context.
type remote struct{ throttler.Backend }

// BenchmarkAcquireRelease is one request's lease through the Throttler over
// the memory backend: what the Throttler adds to the backend's pair.
func BenchmarkAcquireRelease(b *testing.B) {
	p := throttler.Concurrent(1<<10, time.Minute).Named("bench")
	ctx := context.Background()
	m := newMemory(b)
	b.Run("backend", func(b *testing.B) {
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			id := throttler.NewLeaseID()
			if _, err := m.Acquire(ctx, "client", p, id, now); err != nil {
				b.Fatal(err)
			}
			if _, _, err := m.Release(ctx, "client", p, id, now); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
	b.Run("throttler", func(b *testing.B) {
		th := newThrottler(b, m, nil)
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			l, d, err := th.Acquire(ctx, "client", p)
			if err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			if _, err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		report()
	})
}

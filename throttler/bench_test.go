package throttler_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
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
		report(b.N)
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
		report(b.N)
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
		report(b.N)
	})
	b.Run("fallback", func(b *testing.B) { // healthy, a fallback configured: no key held
		th := newThrottler(b, m, &throttler.Options{Fallback: newMemory(b)})
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", p); err != nil {
				b.Fatal(err)
			}
		}
		report(b.N)
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
		report(b.N)
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
		report(b.N)
	})
}

// remote hides the memory backend's Traits (in process), as a network
// backend has none: its calls get the Timeout's context.
type remote struct{ throttler.Backend }

// BenchmarkAcquireRelease is one request's lease through the Throttler over
// the memory backend: what the Throttler adds to the backend's pair.
func BenchmarkAcquireRelease(b *testing.B) {
	p := throttler.ConcurrencyPolicy{Name: "bench", Limit: 1 << 10, TTL: time.Minute}
	ctx := context.Background()
	m := newMemory(b)
	b.Run("backend", func(b *testing.B) {
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		b.ReportAllocs()
		report := cputime.Measure(b)
		for b.Loop() {
			id := throttler.LeaseID(rand.Uint64() | 1)
			if _, err := m.Acquire(ctx, "client", p, id, now); err != nil {
				b.Fatal(err)
			}
			if _, _, err := m.Release(ctx, "client", p, id, now); err != nil {
				b.Fatal(err)
			}
		}
		report(b.N)
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
			if _, _, err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		report(b.N)
	})
}

// BenchmarkAllowInterleaved is what the Throttler costs on top of the
// memory backend, measured side by side: rounds of 1,000 calls each of the
// backend's Take at a fixed now, the same with time.Now read per call (the
// Throttler's clock), the Throttler's Allow, and Allow with an Observe
// hook. Each turn is timed by the thread's own CPU time; the metrics are
// medians over rounds, and the Throttler's own cost is its median
// difference from the backend's Take in the same round (clock included).
func BenchmarkAllowInterleaved(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	ctx := context.Background()
	m := newMemory(b)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	th := newThrottler(b, m, nil)
	seen := 0
	observed := newThrottler(b, m, &throttler.Options{Observe: func(throttler.Observation) { seen++ }})
	calls := []struct {
		name string
		call func() error
	}{
		{"backend", func() error { _, err := m.Take(ctx, "client", p, 1, now); return err }},
		{"backend-clock", func() error { _, err := m.Take(ctx, "client", p, 1, time.Now()); return err }},
		{"throttler", func() error { _, err := th.Allow(ctx, "client", p); return err }},
		{"observed", func() error { _, err := observed.Allow(ctx, "client", p); return err }},
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRounds(b, len(calls))
	for b.Loop() {
		for i, c := range calls {
			start := cputime.Thread()
			for range turn {
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
			r.add(i, start)
		}
	}
	if seen == 0 {
		b.Fatal("nothing observed")
	}
	for i, c := range calls {
		r.report(i, c.name, 0, "-over-backend-ns")
	}
	b.ReportMetric(0, "ns/op")
}

// turn is how many calls an interleaved benchmark makes of each call in a
// round, timed together by the thread's CPU clock.
const turn = 1000

// rounds holds an interleaved benchmark's costs per call, one per round:
// the benchmark runs its turns itself, in its own loop, so that what is
// timed is the call alone.
type rounds struct {
	b     *testing.B
	costs [][]float64 // ns per call, by call, by round
}

func newRounds(b *testing.B, calls int) *rounds {
	return &rounds{b: b, costs: make([][]float64, calls)}
}

// add records call i's turn, started at the thread CPU time start.
func (r *rounds) add(i int, start time.Duration) {
	r.costs[i] = append(r.costs[i], float64(cputime.Thread()-start)/turn)
}

// report reports call i's median cost (name-cpu-ns/op) and, when base is
// another call, the median over rounds of its difference from base in the
// same round (name+suffix).
func (r *rounds) report(i int, name string, base int, suffix string) {
	r.b.ReportMetric(median(r.costs[i]), name+"-cpu-ns/op")
	if base == i {
		return
	}
	d := make([]float64, len(r.costs[i]))
	for k := range d {
		d[k] = r.costs[i][k] - r.costs[base][k]
	}
	r.b.ReportMetric(median(d), name+suffix)
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

package prometheus_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/metrics/prometheus"
	"github.com/throttlekit/throttlekit/throttler"
)

// A limit no benchmark reaches: every call is the same allowed Take.
var benchPolicy = throttler.Policy{Name: "api", Limit: 1 << 40, Window: time.Hour}

// BenchmarkAllow is a memory-backend Allow without metrics, with an Observe
// that does nothing, and with the Prometheus adapter as Observe (the target:
// at most 100 ns and 0 allocations more than none). none to noop is what
// the Throttler pays for any Observe (it reads the clock twice to time the
// call); noop to prometheus is the adapter's own cost.
func BenchmarkAllow(b *testing.B) {
	for _, bc := range []struct {
		name    string
		observe func() func(throttler.Observation)
	}{
		{"none", func() func(throttler.Observation) { return nil }},
		{"noop", func() func(throttler.Observation) { return func(throttler.Observation) {} }},
		{"prometheus", func() func(throttler.Observation) {
			m, err := prometheus.New(nil)
			require.NoError(b, err)
			prom.NewRegistry().MustRegister(m)
			return m.Observe
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			o := throttler.Options{Observe: bc.observe()}
			th, err := throttler.New(traffic.Memory(b), &o)
			require.NoError(b, err)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := th.Allow(ctx, "client", benchPolicy); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllowCPU is BenchmarkAllow's three Throttlers measured side by
// side in one run, on the thread's CPU clock rather than the wall clock: each
// iteration makes a block of calls on each in turn (rotating the order), so
// that the three share the machine's state, and time other processes take
// on a shared machine is not counted. It reports each one's CPU ns per call
// and the differences: hook (none to noop, the Throttler's cost of any
// Observe) and adapter (noop to prometheus, the adapter's own) and total
// (none to prometheus, the figure docs/performance.md states).
func BenchmarkAllowCPU(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	m, err := prometheus.New(nil)
	require.NoError(b, err)
	prom.NewRegistry().MustRegister(m)
	observers := []func(throttler.Observation){nil, func(throttler.Observation) {}, m.Observe}
	var ths []*throttler.Throttler
	for _, o := range observers {
		th, err := throttler.New(traffic.Memory(b), &throttler.Options{Observe: o})
		require.NoError(b, err)
		ths = append(ths, th)
	}
	const block = 256
	ctx := context.Background()
	var cpu [3]time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	round := 0
	for b.Loop() {
		for j := range ths {
			i := (j + round) % len(ths)
			start := cputime.Thread()
			for range block {
				if _, err := ths[i].Allow(ctx, "client", benchPolicy); err != nil {
					b.Fatal(err)
				}
			}
			cpu[i] += cputime.Thread() - start
		}
		round++
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(b.N*block) }
	b.ReportMetric(per(cpu[0]), "none-cpu-ns/call")
	b.ReportMetric(per(cpu[1]), "noop-cpu-ns/call")
	b.ReportMetric(per(cpu[2]), "prom-cpu-ns/call")
	b.ReportMetric(per(cpu[1]-cpu[0]), "hook-cpu-ns/call")
	b.ReportMetric(per(cpu[2]-cpu[1]), "adapter-cpu-ns/call")
	b.ReportMetric(per(cpu[2]-cpu[0]), "total-cpu-ns/call")
	b.ReportMetric(0, "ns/op") // a block of three, not a call: see the metrics above
}

// BenchmarkObserve is the adapter alone, on a call it has seen before.
func BenchmarkObserve(b *testing.B) {
	m, err := prometheus.New(nil)
	require.NoError(b, err)
	o := throttler.Observation{Op: throttler.OpTake, Policy: benchPolicy, Decision: throttler.Decision{Allowed: true}, Latency: 300 * time.Nanosecond}
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(o)
	}
}

// TestObserveDoesNotAllocate pins the hot path's allocations (not its time,
// which the benchmark measures): none once a policy and store are known.
func TestObserveDoesNotAllocate(t *testing.T) {
	m, err := prometheus.New(nil)
	require.NoError(t, err)
	obs := []throttler.Observation{
		{Op: throttler.OpTake, Policy: benchPolicy, Decision: throttler.Decision{Allowed: true}, Latency: time.Microsecond},
		{Op: throttler.OpTake, Policy: benchPolicy, Store: "redis-1", Source: throttler.SourceFallback, Err: context.DeadlineExceeded},
		{Op: throttler.OpAcquire, Concurrency: throttler.ConcurrencyPolicy{Name: "uploads"}, Store: "redis-1"},
	}
	for _, o := range obs {
		m.Observe(o) // resolves the labels
		if n := testing.AllocsPerRun(100, func() { m.Observe(o) }); n != 0 {
			t.Errorf("Observe(%v %s) allocates %v times", o.Op, o.Store, n)
		}
	}
}

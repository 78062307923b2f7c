package benchmarks

import (
	"context"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// shadowKeys are the keys the shadow benchmarks cycle through: enough to
// spread over every worker, few enough to stay in cache.
var shadowKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}()

// shadowMem returns a default memory backend.
func shadowMem(b *testing.B) *memory.Backend {
	b.Helper()
	m, err := memory.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// shadowNew is shadow.New for arguments the benchmark knows are valid.
func shadowNew(b *testing.B, control, candidate throttler.Backend, o *shadow.Options) *shadow.Backend {
	b.Helper()
	s, err := shadow.New(control, candidate, o)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// shadowThrottler is throttler.New on be with a fixed clock.
func shadowThrottler(b *testing.B, be throttler.Backend, now time.Time) *throttler.Throttler {
	b.Helper()
	t, err := throttler.New(be, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// BenchmarkShadowControlPath measures what an application waits for:
// Throttler.Allow over the memory backend alone ("off") and over a Shadow
// that mirrors to a second memory backend ("on"). BenchmarkShadowTake
// measures the bare Backend.Take the same way. One caller, so that the
// candidate's work can run on the other core, as it does beside requests
// that are not a tight loop of limiter calls; dropped/op shows whether the
// workers kept up (drops make "on" look cheaper, so it must stay near 0).
func BenchmarkShadowControlPath(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			var be throttler.Backend = shadowMem(b)
			var s *shadow.Backend
			if mode == "on" {
				s = shadowNew(b, be, shadowMem(b), nil)
				defer s.Close()
				be = s
			}
			t := shadowThrottler(b, be, now)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := t.Allow(ctx, shadowKeys[i&1023], p); err != nil {
					b.Fatal(err)
				}
			}
			reportShadow(b, s)
		})
	}
}

// BenchmarkShadowTake is BenchmarkShadowControlPath on the bare
// Backend.Take. "on-1worker" runs the candidate's work on one goroutine
// instead of eight, which compete with the caller for the CPU when the
// candidate is in-process; "on-free-candidate" mirrors to a candidate that
// does no work, which isolates what queueing costs the caller.
func BenchmarkShadowTake(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, mode := range []string{"off", "on", "on-1worker", "on-free-candidate"} {
		b.Run(mode, func(b *testing.B) {
			var be throttler.Backend = shadowMem(b)
			var s *shadow.Backend
			switch mode {
			case "on":
				s = shadowNew(b, be, shadowMem(b), nil)
			case "on-free-candidate":
				s = shadowNew(b, be, freeBackend{}, nil)
			case "on-1worker":
				s = shadowNew(b, be, shadowMem(b), &shadow.Options{Workers: 1})

			}
			if s != nil {
				defer s.Close()
				be = s
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := be.Take(ctx, shadowKeys[i&1023], p, 1, now); err != nil {
					b.Fatal(err)
				}
			}
			reportShadow(b, s)
		})
	}
}

// reportShadow reports the share of calls dropped and the mismatch rate
// once the queue has drained.
func reportShadow(b *testing.B, s *shadow.Backend) {
	if s == nil {
		return
	}
	b.StopTimer()
	_ = s.Flush(context.Background())
	st := s.Stats()
	b.ReportMetric(float64(st.ByKind[shadow.Dropped])/float64(b.N), "dropped/op")
	if st.Compared > 0 {
		b.ReportMetric(float64(st.Mismatched)/float64(st.Compared), "mismatch-rate")
	}
}

// BenchmarkShadowQueueMemory fills every worker's queue while the candidate
// is stuck, and reports the heap that the queued calls hold: bytes per
// queued call, and the bound for the default options (2 x Workers x
// QueueSize calls, each batch in hand plus a full queue), keys excluded.
func BenchmarkShadowQueueMemory(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const workers, queue = 8, 1024 // the defaults
	// The least over the iterations: anything else allocated meanwhile
	// (the runtime's, the testing package's) only adds to a reading.
	perCall := math.Inf(1)
	for b.Loop() {
		release := make(chan struct{})
		stuck := stuckBackend{release}
		control := shadowMem(b)
		for _, k := range shadowKeys { // the control's own windows are not the queue's
			_, _ = control.Take(ctx, k, p, 1, now)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := shadowNew(b, control, stuck, &shadow.Options{Workers: workers, QueueSize: queue, Timeout: time.Hour})
		// Far more calls than fit: every queue ends full, the rest drop.
		for i := range 4 * workers * queue {
			_, _ = s.Take(ctx, shadowKeys[i&1023], p, 1, now)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		queued := s.Stats().Queued
		perCall = min(perCall, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(queued))
		close(release)
		_ = s.Close()
	}
	b.ReportMetric(perCall, "B/queued-call")
	b.ReportMetric(perCall*2*workers*queue/(1<<20), "MiB-bound-default")
}

// stuckBackend answers nothing until release is closed.
type stuckBackend struct{ release chan struct{} }

func (s stuckBackend) wait(ctx context.Context) error {
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s stuckBackend) Take(ctx context.Context, _ string, _ throttler.Policy, _ int64, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

func (s stuckBackend) Peek(ctx context.Context, _ string, _ throttler.Policy, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

func (s stuckBackend) Refund(ctx context.Context, _ string, _ throttler.Policy, _ int64, _, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

// freeBackend answers every call at once with an empty decision.
type freeBackend struct{}

func (freeBackend) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

func (freeBackend) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

func (freeBackend) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

// BenchmarkShadowLatency times each call of a caller that does about a
// microsecond of its own work between calls, as a request handler does,
// instead of calling in a tight loop: the candidate's work then has room
// beside the caller's on 2 cores, and what is measured is the latency a
// request sees, on the bare Backend.Take and through Throttler.Allow. It
// reports the median and the 99th percentile of the call alone, less the
// cost of reading the clock around it.
func BenchmarkShadowLatency(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clockCost := clockReadCost()
	for _, mode := range []string{"take-off", "take-on", "throttler-off", "throttler-on"} {
		b.Run(mode, func(b *testing.B) {
			var be throttler.Backend = shadowMem(b)
			var s *shadow.Backend
			if strings.HasSuffix(mode, "-on") {
				s = shadowNew(b, be, shadowMem(b), nil)
				defer s.Close()
				be = s
			}
			call := func(key string) error { _, err := be.Take(ctx, key, p, 1, now); return err }
			if strings.HasPrefix(mode, "throttler") {
				t := shadowThrottler(b, be, now)
				call = func(key string) error { _, err := t.Allow(ctx, key, p); return err }
			}
			lat := make([]time.Duration, 0, 1<<20)
			var buf [64]byte
			for i := 0; b.Loop(); i++ {
				requestWork(&buf)
				start := time.Now()
				if err := call(shadowKeys[i&1023]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))] - clockCost) }
			b.ReportMetric(pct(0.5), "p50-ns")
			b.ReportMetric(pct(0.99), "p99-ns")
			reportShadow(b, s)
		})
	}
}

var workSink uint64

// requestWork stands for the request's own work: about a microsecond of
// arithmetic.
func requestWork(buf *[64]byte) {
	h := workSink
	for range 10 {
		for i := range buf {
			h = h*31 + uint64(buf[i]) + uint64(i)
		}
	}
	workSink = h
}

// clockReadCost is the median time between two clock reads with nothing in
// between: what timing a call adds to it.
func clockReadCost() time.Duration {
	d := make([]time.Duration, 10001)
	for i := range d {
		start := time.Now()
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	return d[len(d)/2]
}

package shadow

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// benchKeys spread the calls over every worker and stay in cache.
var benchKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}()

// stuck answers nothing until release is closed or its context ends.
type stuck struct{ release chan struct{} }

func (s stuck) wait(ctx context.Context) error {
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s stuck) Take(ctx context.Context, _ string, _ throttler.Policy, _ int64, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

func (s stuck) Peek(ctx context.Context, _ string, _ throttler.Policy, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

func (s stuck) Refund(ctx context.Context, _ string, _ throttler.Policy, _ int64, _, _ time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, s.wait(ctx)
}

// BenchmarkTake measures the caller's path, which is all a request waits for: the control alone
// ("off"), a shadow over a healthy in-process candidate without and with Publish, and a shadow
// whose candidate is stuck, so that every call is dropped, without Publish, with the cheapest
// Publish (an atomic add), and with one that takes about a microsecond (a log line's worth of
// work). One caller, so that the shadow's own goroutines have the other core. caller-cpu-ns/op is
// the CPU time of the caller's thread: on a shared machine it is steadier than ns/op.
func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	for _, mode := range []string{"off", "on", "on-publish", "dropping", "dropping-publish", "dropping-publish-1us"} {
		b.Run(mode, func(b *testing.B) {
			var published atomic.Uint64
			be, done := benchShadow(b, mode, &published)
			defer done()
			var before Stats
			if s, ok := be.(*Backend); ok {
				before = s.Stats()
			}
			b.ReportAllocs()
			report := measureCPU(b)
			for i := 0; b.Loop(); i++ {
				if _, err := be.Take(ctx, benchKeys[i&1023], p, 1, t0); err != nil {
					b.Fatal(err)
				}
			}
			report()
			if s, ok := be.(*Backend); ok {
				// Drops make a healthy mode look cheaper: they must stay near 0
				// there.
				b.StopTimer()
				if !strings.HasPrefix(mode, "dropping") {
					_ = s.Flush(ctx)
				}
				b.ReportMetric(float64(s.Stats().ByKind[Dropped]-before.ByKind[Dropped])/float64(b.N), "dropped/op")
			}
		})
	}
}

// BenchmarkTakeParallel is BenchmarkTake with every core calling: what the callers contend on when
// the candidate is stuck and every call drops.
func BenchmarkTakeParallel(b *testing.B) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	for _, mode := range []string{"dropping", "dropping-publish"} {
		b.Run(mode, func(b *testing.B) {
			var published atomic.Uint64
			be, done := benchShadow(b, mode, &published)
			defer done()
			b.ReportAllocs()
			var next atomic.Uint64
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1) * 97
				for pb.Next() {
					i++
					if _, err := be.Take(ctx, benchKeys[i&1023], p, 1, t0); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFlush measures a Flush with nothing left to compare.
func BenchmarkFlush(b *testing.B) {
	ctx := context.Background()
	s, err := New(mem(b), mem(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// benchShadow builds the backend a mode names and returns it with the function that stops it.
func benchShadow(b *testing.B, mode string, published *atomic.Uint64) (throttler.Backend, func()) {
	b.Helper()
	if mode == "off" {
		return mem(b), func() {}
	}
	var o Options
	switch mode {
	case "on-publish", "dropping-publish":
		o.Publish = func(Result) { published.Add(1) }
	case "dropping-publish-1us":
		o.Publish = func(Result) { published.Add(work(3000)) }
	}
	var candidate throttler.Backend = mem(b)
	release := make(chan struct{})
	dropping := strings.HasPrefix(mode, "dropping")
	if dropping {
		candidate = stuck{release}
		o.Timeout = time.Hour
		o.DrainTimeout = time.Millisecond
	}
	s, err := New(mem(b), candidate, &o)
	if err != nil {
		b.Fatal(err)
	}
	if dropping {
		// Fill every queue first, so that the timed calls all drop.
		p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
		for i := range 16 * 1024 {
			_, _ = s.Take(context.Background(), benchKeys[i&1023], p, 1, t0)
		}
	}
	return s, func() {
		b.StopTimer()
		close(release)
		_ = s.Close()
	}
}

// work does n steps of arithmetic (3000 take about a microsecond) and returns their result, for the
// caller to keep.
func work(n int) uint64 {
	h := uint64(n)
	for i := range n {
		h = h*31 + uint64(i)
	}
	return h
}

package flags

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	unleash "github.com/Unleash/unleash-client-go/v4"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/throttler"
)

// nopBackend answers at once, so a benchmark through the Router measures
// the Router's own cost.
type nopBackend struct{ _ int }

func (*nopBackend) Take(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*nopBackend) Peek(_ context.Context, _ string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*nopBackend) Refund(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}

func benchKeys() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	return keys
}

func benchUnleashClient(b *testing.B, rollout int) *unleash.Client {
	f := newFakeUnleash(b)
	f.set(flexible("feat", "feat", rollout))
	c, wait := f.client(b, time.Hour)
	wait()
	return c
}

// BenchmarkRouterTake: the Router's added cost per call is each source's
// figure minus "direct".
func BenchmarkRouterTake(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "rollout.json")
	if err := os.WriteFile(path, []byte(`{"percent": 50}`), 0o644); err != nil {
		b.Fatal(err)
	}
	file, err := NewFile(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer file.Close()
	c := benchUnleashClient(b, 50)
	backends := []struct {
		name string
		b    throttler.Backend
	}{
		{"direct", &nopBackend{}},
		{"static", NewRouter(&nopBackend{}, &nopBackend{}, NewPercent(50), nil)},
		{"static-0pct", NewRouter(&nopBackend{}, &nopBackend{}, NewPercent(0), nil)},
		{"file", NewRouter(&nopBackend{}, &nopBackend{}, file, nil)},
		{"unleash", NewRouter(&nopBackend{}, &nopBackend{}, NewUnleash(c, "feat", nil), nil)},
	}
	ctx, now, pol, keys := context.Background(), time.Unix(1e9, 0), throttler.PerHour(5000).Named("api"), benchKeys()
	for _, bb := range backends {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := startThreadCPU(b)
			for i := 0; b.Loop(); i++ {
				bb.b.Take(ctx, keys[i&1023], pol, 1, now)
			}
			cpu.report(b)
		})
		b.Run(bb.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					bb.b.Take(ctx, keys[i&1023], pol, 1, now)
				}
			})
		})
	}
}

func BenchmarkBucket(b *testing.B) {
	keys := benchKeys()
	bk := newBucketer(DefaultGroupID)
	b.ReportAllocs()
	cpu := startThreadCPU(b)
	for i := 0; b.Loop(); i++ {
		bk.bucket(keys[i&1023])
	}
	cpu.report(b)
}

// threadCPU measures the CPU time of the benchmark's own thread, reported
// as cpu-ns/op next to the wall-clock ns/op: on a shared machine the wall
// clock also counts the time other processes held the CPU.
type threadCPU struct{ start time.Duration }

func startThreadCPU(b *testing.B) threadCPU {
	runtime.LockOSThread()
	b.Cleanup(runtime.UnlockOSThread)
	return threadCPU{start: threadCPUTime()}
}

func (c threadCPU) report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(threadCPUTime()-c.start)/float64(b.N), "cpu-ns/op")
	}
}

func threadCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkUnleashClientIsEnabled is the client's own per-call cost (with
// its metrics on, as in production): the reason the source evaluates from
// the client's definitions instead.
func BenchmarkUnleashClientIsEnabled(b *testing.B) {
	c := benchUnleashClient(b, 50)
	keys := benchKeys()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.IsEnabled("feat", unleash.WithContext(ucontext.Context{UserId: keys[i&1023]}))
	}
}

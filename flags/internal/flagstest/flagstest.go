// Package flagstest holds what the tests and benchmarks of package flags
// and flags/unleash share: keys of every shape, a backend that does
// nothing, and a per-thread CPU clock.
package flagstest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// Keys returns n distinct keys of several shapes, including long and
// non-ASCII ones.
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = "user-" + strconv.Itoa(i)
		case 1:
			keys[i] = fmt.Sprintf("203.0.%d.%d", i/256%256, i%256)
		case 2:
			keys[i] = "clé-ü-" + strconv.Itoa(i*7919)
		default:
			keys[i] = strings.Repeat("k", 150+i%100) + strconv.Itoa(i)
		}
	}
	return keys
}

// BenchKeys are the 1,024 keys the benchmarks cycle through.
func BenchKeys() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	return keys
}

// Nop answers at once, so a benchmark through a Router measures the
// Router's own cost.
type Nop struct{ _ int }

func (*Nop) Take(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*Nop) Peek(_ context.Context, _ string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*Nop) Refund(_ context.Context, _ string, p throttler.Policy, _ int64, _, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}

// BenchTake runs Take on be, on one goroutine (with cpu-ns/op) and on
// GOMAXPROCS goroutines (name/parallel).
func BenchTake(b *testing.B, name string, be throttler.Backend) {
	ctx, now, pol, keys := context.Background(), time.Unix(1e9, 0), throttler.PerHour(5000).Named("api"), BenchKeys()
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		cpu := StartThreadCPU(b)
		for i := 0; b.Loop(); i++ {
			be.Take(ctx, keys[i&1023], pol, 1, now)
		}
		cpu.Report(b)
	})
	b.Run(name+"/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				be.Take(ctx, keys[i&1023], pol, 1, now)
			}
		})
	})
}

// ThreadCPU measures the CPU time of the benchmark's own thread, reported
// as cpu-ns/op next to the wall-clock ns/op: on a shared machine the wall
// clock also counts the time other processes held the CPU.
type ThreadCPU struct{ start time.Duration }

// StartThreadCPU locks the benchmark to its thread and starts measuring.
func StartThreadCPU(b *testing.B) ThreadCPU {
	runtime.LockOSThread()
	b.Cleanup(runtime.UnlockOSThread)
	return ThreadCPU{start: cputime.Thread()}
}

// Report adds the cpu-ns/op metric.
func (c ThreadCPU) Report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(cputime.Thread()-c.start)/float64(b.N), "cpu-ns/op")
	}
}

// Refused takes one unit twice for every key, at now, under a fixed window
// of one unit an hour enforced by e, through a Throttler over a fresh memory
// backend, and returns the keys whose second call was refused. Every other
// second call must be admitted and reported as a would-be denial, which t
// checks.
func Refused(t testing.TB, e throttler.Enforcer, keys []string, now time.Time) map[string]bool {
	t.Helper()
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.PerHour(1).Named("enforced").EnforcedBy(e)
	refused := map[string]bool{}
	ctx := context.Background()
	for _, k := range keys {
		for i := range 2 {
			d, err := th.Allow(ctx, k, p)
			switch {
			case err != nil:
				t.Fatalf("key %q: %v", k, err)
			case i == 0 && (!d.Allowed || d.WouldDeny):
				t.Fatalf("key %q: the first call was not simply admitted: %+v", k, d)
			case i == 1 && d.Allowed && !d.WouldDeny:
				t.Fatalf("key %q: the second call was admitted without a would-be denial: %+v", k, d)
			case i == 1 && !d.Allowed:
				refused[k] = true
			}
		}
	}
	return refused
}

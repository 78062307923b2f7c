package flags

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/internal/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRouterTake: the Router's added cost per call is each source's
// figure minus "direct". The Unleash source's figure is in package
// flags/unleash.
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
	backends := []struct {
		name string
		b    throttler.Backend
	}{
		{"direct", &flagstest.Nop{}},
		{"static", router(b, &flagstest.Nop{}, &flagstest.Nop{}, percent(b, 50), nil)},
		{"static-0pct", router(b, &flagstest.Nop{}, &flagstest.Nop{}, percent(b, 0), nil)},
		{"file", router(b, &flagstest.Nop{}, &flagstest.Nop{}, file, nil)},
	}
	for _, bb := range backends {
		benchTake(b, bb.name, bb.b)
	}
}

func BenchmarkBucket(b *testing.B) {
	keys := flagstest.BenchKeys()
	bk := rollout.NewBucketer(DefaultGroupID)
	b.ReportAllocs()
	report := cputime.Measure(b)
	for i := 0; b.Loop(); i++ {
		bk.Bucket(keys[i&1023])
	}
	report(b.N)
}

// localNop is flagstest.Nop in process, so that a Throttler calls it
// without a timeout context, whose cost would hide the router's.
type localNop struct{ flagstest.Nop }

func (*localNop) Traits() throttler.Traits { return throttler.Traits{InProcess: true} }

// BenchmarkThrottlerOverRouter: a Throttler's Allow through a Router at
// 50%, the path on which the Throttler names each call's store (for its
// breakers) and the Router sends it.
func BenchmarkThrottlerOverRouter(b *testing.B) {
	keys := flagstest.BenchKeys()
	now := time.Unix(1e9, 0)
	th, err := throttler.New(router(b, &localNop{}, &localNop{}, percent(b, 50), nil),
		&throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	ctx, p := context.Background(), throttler.PerHour(5000).Named("api")
	b.ReportAllocs()
	report := cputime.Measure(b)
	for i := 0; b.Loop(); i++ {
		_, _ = th.Allow(ctx, keys[i&1023], p)
	}
	report(b.N)
}

// benchTake runs Take on be, on one goroutine (with cpu-ns/op) and on
// GOMAXPROCS goroutines (name/parallel).
func benchTake(b *testing.B, name string, be throttler.Backend) {
	ctx, now, pol, keys := context.Background(), time.Unix(1e9, 0), throttler.PerHour(5000).Named("api"), flagstest.BenchKeys()
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		report := cputime.Measure(b)
		for i := 0; b.Loop(); i++ {
			be.Take(ctx, keys[i&1023], pol, 1, now)
		}
		report(b.N)
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

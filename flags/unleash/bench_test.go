package unleash

import (
	"context"
	"testing"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

func benchClient(b *testing.B, rollout int) *unleashsdk.Client {
	f := newFakeUnleash(b)
	f.set(flexible("feat", "feat", rollout))
	c, wait := f.client(b, time.Hour)
	wait()
	return c
}

// BenchmarkRouterTake is flags' BenchmarkRouterTake with this source: the
// Router's added cost per call is "unleash" minus "direct".
func BenchmarkRouterTake(b *testing.B) {
	r, err := flags.NewRouter(&flagstest.Nop{}, &flagstest.Nop{}, source(b, benchClient(b, 50), "feat", nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	benchTake(b, "direct", &flagstest.Nop{})
	benchTake(b, "unleash", r)
}

// BenchmarkClientIsEnabled is the client's own per-call cost (with its
// metrics on, as in production): the reason the source evaluates from the
// client's definitions instead.
func BenchmarkClientIsEnabled(b *testing.B) {
	c := benchClient(b, 50)
	keys := flagstest.BenchKeys()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.IsEnabled("feat", unleashsdk.WithContext(ucontext.Context{UserId: keys[i&1023]}))
	}
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
